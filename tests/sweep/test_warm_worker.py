"""The warm trial worker without Ray (sweep/warm_worker.py): one process runs trial after trial,
its peaks stay those of a fresh process, failures become statuses, liger's patches are undone.
The GPU version of the peak check is tests/gpu/test_warm_worker_gpu.py; the Ray path is covered
by the sweep tests (warm workers are the default)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from dpo_sweep.sweep import warm_worker
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport, TrialFailure
from dpo_sweep.sweep.task import TrialTask
from dpo_sweep.sweep.warm_worker import TrialWorker
from dpo_sweep.train.faults import InjectedFault
from testkit import make_cfg

REPO = Path(__file__).resolve().parents[2]


def _cfg(micro_batch: int, length: int, **kw):
    half = length // 2 - 1  # prompt + response + bos/eos fill max_length
    return make_cfg(micro_batch=micro_batch, max_length=length, steps=3,
                    data={"synthetic": {"pairs": 32, "prompt_tokens": half, "response_tokens": half}}, **kw)


def _run(worker: TrialWorker, cfg, trial_start: float | None = None,
         fault: InjectedFault | None = None) -> tuple[list, object, TrialFailure | None]:
    start = time.time() if trial_start is None else trial_start
    items = list(worker.run(TrialTask(cfg, fault=fault, trial_start=start)))
    failure = next((i for i in items if isinstance(i, TrialFailure)), None)
    reports = [i for i in items if not isinstance(i, TrialFailure)]
    outcomes = [o.result for i in reports if (o := OutcomeReport.from_report(i))]
    return [s for i in reports if (s := StepReport.from_report(i))], (outcomes[0] if outcomes else None), failure


CHILD = REPO / "tests" / "warm_child.py"
SMALL = {"preset": "tiny-llama", "micro_batch": 2, "level": "none", "length": 128, "device": "cpu"}
BIGGER = {"preset": "tiny-llama", "micro_batch": 16, "level": "none", "length": 512, "device": "cpu"}


def _child(specs: list[dict]) -> list[dict]:
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(specs)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    assert all(r["status"] == "ok" for r in rows), rows
    return rows


def test_a_trial_after_a_bigger_one_reports_a_fresh_process_peak():
    # Each side in its own child process: this test session's own memory must not count.
    [fresh] = _child([SMALL])
    big, small = _child([BIGGER, SMALL])
    assert big["peak_mem_gb"] > 1.5 * fresh["peak_mem_gb"]  # the earlier trial did need much more memory
    # Process RSS on the CPU: without the release between trials this read ~2.3x (measured:
    # 1.26 vs 0.56 GB), with it within 1% of the fresh process alone, +3.7% once inside a full
    # suite run (0.707 vs 0.682 GB); 5% leaves room for the allocator and still catches a leak.
    assert small["peak_mem_gb"] == pytest.approx(fresh["peak_mem_gb"], rel=0.05)


def test_start_up_split_the_trial_that_waited_for_the_import_pays_it_later_ones_do_not():
    started = time.time()  # this trial started the worker: it waits for the import
    worker = TrialWorker()
    _, first, _ = _run(worker, _cfg(2, 64), trial_start=started)
    _, second, _ = _run(worker, _cfg(2, 64))
    assert first.startup_import_s > 0 and second.startup_import_s == 0
    for row in (first, second):
        split = [row.startup_ray_s, row.startup_import_s, row.startup_data_s, row.startup_model_s]
        assert all(math.isfinite(s) and s >= 0 for s in split)
        assert sum(split) <= row.startup_s + 1e-6


def test_the_first_trials_log_says_when_its_workers_imports_ran(capsys):
    # What the trial prints goes to its log file in a worker process (trial_run.output_to_file, fd 1);
    # under pytest it is captured here.
    started = time.time()
    worker = TrialWorker()
    said = []
    for cfg in (_cfg(2, 64, trial_id="first"), _cfg(2, 64, trial_id="second")):
        capsys.readouterr()
        list(worker.run(TrialTask(cfg, trial_start=started)))
        said.append(capsys.readouterr().out)
    assert said[0].startswith("[first] warm worker: imports took ") and "s of the trial's start" in said[0]
    assert "warm worker:" not in said[1]  # later trials did not wait for it
    assert warm_worker.import_window_line("t", 100.0, 104.5, 102.0) == \
        "[t] warm worker: imports took 4.5 s, from -2.0 s to +2.5 s of the trial's start"


def test_oom_is_a_status_and_the_worker_runs_the_next_trial():
    worker = TrialWorker()
    steps, outcome, failure = _run(worker, _cfg(2, 64), fault=InjectedFault(2, "oom"))
    assert outcome is None and len(steps) == 1
    assert failure.status == "oom" and failure.error.startswith("rank 0: injected OOM at step 2")
    assert failure.process_usable  # an OOM leaves the process usable: no new worker
    _, after, _ = _run(worker, _cfg(2, 64))
    assert after.status == "ok"


def test_an_error_asks_for_a_new_worker():
    _, _, failure = _run(TrialWorker(), _cfg(2, 64), fault=InjectedFault(1, "error"))
    assert failure.status == "error" and not failure.process_usable  # a new worker takes its place


def test_warm_workers_only_for_one_worker_trials_and_can_be_switched_off():
    assert warm_worker.wanted(make_cfg())
    assert not warm_worker.wanted(make_cfg(resources={"use_gpu": False, "warm_workers": False}))
    assert not warm_worker.wanted(make_cfg(resources={"use_gpu": False, "workers_per_trial": 2}))


def test_liger_patches_are_undone_after_the_trial(monkeypatch):
    from transformers.models.llama import modeling_llama

    from dpo_sweep.config import ModelSpec
    from dpo_sweep.train import model as model_mod

    stock_norm, stock_rope = modeling_llama.LlamaRMSNorm, modeling_llama.apply_rotary_pos_emb

    def fake_patch(**_kw):  # what liger-kernel does: replace module attributes, add its own
        modeling_llama.LlamaRMSNorm = type("LigerRMSNorm", (), {})
        modeling_llama.apply_rotary_pos_emb = lambda *a: a
        modeling_llama._liger_marker = True

    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_llama = fake.apply_liger_kernel_to_qwen2 = fake_patch
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    model_mod.apply_liger(ModelSpec(preset="tiny-llama"), "llama")
    assert modeling_llama.LlamaRMSNorm is not stock_norm
    model_mod.undo_liger()
    assert modeling_llama.LlamaRMSNorm is stock_norm
    assert modeling_llama.apply_rotary_pos_emb is stock_rope
    assert not hasattr(modeling_llama, "_liger_marker")


def test_a_warm_worker_never_imports_ray_train():
    # Its trials report through the actor's stream, not Ray Train: importing it cost 2.1 s of the
    # worker's start on the H200 (benchmarks/results/sweep_overhead/h200-warm-worker-pool/).
    script = ("import sys, time\nsys.path.insert(0, 'tests')\nfrom testkit import make_cfg\n"
              "from dpo_sweep.sweep.task import TrialTask\n"
              "from dpo_sweep.sweep.warm_worker import TrialWorker\nw = TrialWorker()\n"
              "list(w.run(TrialTask(make_cfg(steps=1), trial_start=time.time())))\n"
              "print('ray.train' in sys.modules, 'ray.tune' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "False False"


def test_a_warm_worker_imports_with_scikit_learn_hidden_and_freezes_what_it_imported(tmp_path):
    # transformers 5.17 imports scikit-learn with its generation code when it is installed: 1.9 s
    # of a warm worker's imports on the H200 that no trial uses. A stand-in scikit-learn, and an
    # import hook that notes, when the worker imports the trainer, whether it can see it.
    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "__init__.py").write_text("IMPORTED = True\n")
    script = ("import gc, importlib.util, sys\nsys.path[:0] = [sys.argv[1]]\nseen = []\n"
              "class Peek:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'dpo_sweep.train.loop':\n"
              "            seen.append(importlib.util.find_spec('sklearn') is not None)\n"
              "sys.meta_path.insert(0, Peek())\n"
              "from dpo_sweep.sweep.warm_worker import TrialWorker\n"
              "frozen = gc.get_freeze_count()\nw = TrialWorker()\n"
              "import sklearn\n"
              "print(seen, sklearn.IMPORTED, gc.get_freeze_count() > frozen)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # hidden while the trainer imported (once, in the worker's start); importable as usual
    # afterwards; the imports frozen
    assert done.stdout.splitlines()[-1] == "[False] True True"


def test_unused_packages_look_uninstalled_only_within_the_block(tmp_path, monkeypatch):
    import importlib
    import importlib.util

    from dpo_sweep.sweep.worker_setup import unused_packages_hidden

    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sklearn", raising=False)
    with unused_packages_hidden():
        assert importlib.util.find_spec("sklearn") is None
        with pytest.raises(ImportError):
            importlib.import_module("sklearn")
    assert "sklearn" not in sys.modules
    assert importlib.util.find_spec("sklearn") is not None
    imported = importlib.import_module("sklearn")
    with unused_packages_hidden():  # one already imported stays
        assert sys.modules["sklearn"] is imported
    monkeypatch.delitem(sys.modules, "sklearn")


def test_a_worker_tokenises_its_sweeps_data_as_it_starts_and_its_first_trial_finds_it(monkeypatch):
    from dpo_sweep.train import warm_state

    calls, real = [], warm_state.tokenized_pairs

    def counted(cfg):
        calls.append(threading.current_thread().name)
        return real(cfg)

    monkeypatch.setattr(warm_state, "tokenized_pairs", counted)
    cfg = _cfg(2, 64)
    _, row, _ = _run(TrialWorker(data=cfg), cfg)
    assert row.status == "ok" and calls == ["prefetch-data"]  # made once, by the worker's start


def test_a_trial_waits_for_the_prefetch_and_a_failed_one_is_the_trials_to_meet(monkeypatch):
    from dpo_sweep.train import warm_state

    calls, release = [], threading.Event()

    def slow(cfg):
        calls.append(cfg.train.max_length)
        release.wait(5)
        if cfg.train.max_length == 32:
            raise ValueError("a bad row")
        return "tokenizer", "pairs"

    monkeypatch.setattr(warm_state, "tokenized_pairs", slow)
    warm = warm_state.WarmState()
    cfg = _cfg(2, 64)
    thread = warm.prefetch(cfg)
    waiter = threading.Thread(target=lambda: calls.append(warm.tokenized_pairs(cfg)))
    waiter.start()
    time.sleep(0.2)
    release.set()
    thread.join(5)
    waiter.join(5)
    assert calls == [64, ("tokenizer", "pairs")]  # tokenised once; the trial's call waited for it
    bad = _cfg(2, 32)
    warm.prefetch(bad).join(5)  # the prefetch's failure is swallowed ...
    with pytest.raises(ValueError, match="a bad row"):
        warm.tokenized_pairs(bad)  # ... and the trial meets it


def test_workers_tokenise_at_start_only_the_data_every_trial_reads():
    same = [_cfg(2, 64), _cfg(4, 64, checkpoint_level="full")]
    assert warm_worker.shared_data(same) is same[0]
    assert warm_worker.shared_data([_cfg(2, 64), _cfg(2, 128)]) is None  # a swept max_length: the trials tokenise
