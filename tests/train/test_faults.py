"""Injected faults (train/faults.py): the tests' own channel, DPO_SWEEP_TEST_FAULTS, out of the
space file's schema; the rules it holds, which trials they reach, and what the trainer does."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from dpo_sweep import space as space_mod
from dpo_sweep.cli import main
from dpo_sweep.errors import SpaceError, UserError
from dpo_sweep.records import read_csv_rows
from dpo_sweep.train.faults import FAULTS_ENV, InjectedFailure, InjectedFault, fault_for, fault_rules, inject
from testkit import make_cfg


def _rules(value) -> tuple:
    return fault_rules({FAULTS_ENV: value if isinstance(value, str) else json.dumps(value)})


def test_no_variable_no_rules_and_no_fault():
    assert fault_rules({}) == () and fault_for((), make_cfg()) is None


def test_a_rule_reaches_the_trials_its_when_names_and_the_first_match_wins():
    rules = _rules([{"step": 2, "kind": "oom", "rank": 1, "when": {"checkpoint_level": "L1", "train.seed": 1}},
                    {"step": 3}])
    hit = make_cfg(checkpoint_level="L1", seed=1)
    assert fault_for(rules, hit) == InjectedFault(2, "oom", 1)
    assert fault_for(rules, make_cfg(checkpoint_level="L1", seed=0)) == InjectedFault(3, "error", None)
    assert fault_for(_rules({"step": 1, "when": {"micro_batch": 4}}), make_cfg(micro_batch=2)) is None


@pytest.mark.parametrize("value, says", [
    ("{not json", "not JSON"),
    ({"step": 0}, "step: 0 is not allowed"),
    ({"step": 1, "kind": "segfault"}, "kind: 'segfault' is not allowed; give one of error, oom, nan"),
    ({"step": 1, "rank": -1}, "rank: -1 is not allowed"),
    ({"step": 1, "at": 2}, "unknown key(s) ['at']"),
    ([3], "each rule is a JSON object"),
])
def test_a_bad_value_is_refused_with_what_is_wrong(value, says):
    with pytest.raises(UserError, match=FAULTS_ENV) as info:
        _rules(value)
    assert says in str(info.value)


def test_when_naming_no_field_is_refused():
    with pytest.raises(UserError, match="'train.fail_at' is not a field"):
        fault_for(_rules({"step": 1, "when": {"train.fail_at": 1}}), make_cfg())


def test_inject_fires_at_its_step_on_its_rank():
    assert inject(None, 1) is False
    assert inject(InjectedFault(2, "nan"), 1) is False and inject(InjectedFault(2, "nan"), 2) is True
    assert inject(InjectedFault(2, "error", rank=1), 2, rank=0) is False
    with pytest.raises(InjectedFailure, match="injected failure at step 2"):
        inject(InjectedFault(2, "error", rank=1), 2, rank=1)
    with pytest.raises(torch.OutOfMemoryError, match="injected OOM at step 1"):
        inject(InjectedFault(1, "oom"), 1)


def test_a_space_file_that_names_a_fault_gets_the_unknown_field_error(tmp_path):
    raw = yaml.safe_load(open("search_spaces/quickstart.yaml"))
    raw["train"]["fail_at_step"] = 2
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpaceError, match="fail_at_step"):
        space_mod.load(path)


def test_the_trial_command_injects_the_variables_fault(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAULTS_ENV, '{"step": 1, "kind": "error"}')
    out = tmp_path / "t"
    assert main(["trial", "search_spaces/quickstart.yaml", "--set", "train.steps=3", "--output", str(out)]) == 1
    row, = read_csv_rows(out / "results.csv")
    assert row["status"] == "error" and "InjectedFailure: injected failure at step 1" in row["error"]
