"""The trial's message across Ray (sweep/task.py): typed, frozen, the shared settings with each
trial's configuration, and a test's stand-in trainer pickled by reference (never its code)."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
from ray import cloudpickle

from dpo_sweep.sweep.task import TrialTask, resolve_trainer, task_of, trial_id_of
from dpo_sweep.train.faults import InjectedFault
from oom_from_micro_batch_2 import run_trial as stand_in
from testkit import make_cfg


def test_the_searchers_task_keeps_the_shared_settings_and_takes_each_trials_configuration():
    shared = TrialTask(make_cfg(trial_id="t000"), use_gpu=True, storage_path="/r/ray", log_dir="/r/logs",
                       warm_pool="pool-1", trainer=stand_in)
    task = shared.for_trial(make_cfg(trial_id="t001", micro_batch=2), InjectedFault(2, "oom"))
    assert (task.trial_id, task.cfg.micro_batch, task.fault) == ("t001", 2, InjectedFault(2, "oom"))
    assert (task.use_gpu, task.storage_path, task.log_dir, task.warm_pool, task.trainer) == \
        (True, "/r/ray", "/r/logs", "pool-1", stand_in)
    config = task.as_config()
    assert task_of(config) is task and trial_id_of(config) == "t001"
    started = task.started(at=123.5)
    assert started.trial_start == 123.5 and task.trial_start == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.use_gpu = False


def test_a_stand_in_trainer_crosses_by_reference_and_the_real_one_is_the_default():
    task = TrialTask(make_cfg(), trainer=stand_in)
    data = cloudpickle.dumps(task.as_config())
    assert b"oom_from_micro_batch_2" in data and b"OOM_FROM_MICRO_BATCH" not in data  # a name, not its code
    back = task_of(pickle.loads(data))
    assert back.run_trial() is stand_in and back.cfg == task.cfg
    from dpo_sweep.train.loop import run_trial

    assert resolve_trainer(None) is run_trial and TrialTask(make_cfg()).run_trial() is run_trial
