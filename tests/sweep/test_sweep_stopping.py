"""Ending a sweep early and its console, without Ray: the same-failure rule, the SIGINT handler,
the stopper, the recorder's early stop and ETA, the worker's log file and the token command."""
from __future__ import annotations

import csv
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import end_trial, make_cfg

from dpo_sweep.sweep import recorder, stopping, trial_run
from dpo_sweep.records import TrialResult
from dpo_sweep.sweep.protocol import OutcomeReport, TrialEnding, TrialFailure
from dpo_sweep.sweep.ray_cluster import auth_token_command
from dpo_sweep.sweep.stopping import Ending, StopRequest, SweepStopper, same_early_failure

LIGER = "rank 0: UserError: model.liger_kernel: true needs a CUDA GPU"


def test_causes_compare_without_trial_ids_and_numbers():
    a = stopping.normalise_cause("rank 0: RuntimeError: t000_mb2 failed at 0x7f3a after 12.5 s", "t000_mb2")
    b = stopping.normalise_cause("rank 1: RuntimeError: t001_mb4  failed at 0xbeef after 3 s", "t001_mb4")
    assert a == b
    assert a != stopping.normalise_cause("rank 0: ValueError: t000 failed", "t000")


@pytest.mark.parametrize("endings, todo, want", [
    ([Ending("t0", "error", 0, LIGER), Ending("t1", "error", 0, LIGER.replace("0", "1"))], 5, LIGER),
    ([Ending("t0", "error", 0, LIGER)], 5, None),                      # one is not yet the sweep's
    ([Ending("t0", "error", 0, LIGER)], 1, LIGER),                     # ... unless it is every trial
    ([Ending("t0", "error", 0, LIGER), Ending("t1", "error", 1, LIGER)], 5, None),  # one step ran
    ([Ending("t0", "oom", 0, LIGER), Ending("t1", "error", 0, LIGER)], 5, None),
    ([Ending("t0", "error", 0, LIGER), Ending("t1", "error", 0, "rank 0: OSError: no such file")], 5, None),
    ([Ending("t0", "ok", 3, ""), Ending("t1", "error", 0, LIGER), Ending("t2", "error", 0, LIGER)], 5, None),
])
def test_same_early_failure_needs_the_first_trials_all_failing_alike_before_a_step(endings, todo, want):
    assert same_early_failure(endings, todo) == want


def test_stopper_stops_everything_only_once_the_running_trials_were_ended():
    request = StopRequest()
    stopper = SweepStopper(request)
    assert stopper.stop_all() is False and stopper("t", {}) is False
    request.reason = stopping.INTERRUPTED
    assert stopper.stop_all() is False  # Tune's own stop would wait 10 s on each running trial
    request.trials_ended = True
    assert stopper.stop_all() is True and request.interrupted


def test_first_sigint_requests_the_stop_and_a_second_interrupts():
    # Python's own handler before the block, whatever an earlier test of the session left installed
    signal.signal(signal.SIGINT, signal.default_int_handler)
    request = StopRequest()
    with stopping.stop_on_sigint(request):
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt
        assert request.reason == stopping.INTERRUPTED
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_as_ctrl_c_does_and_a_second_interrupts(signum):
    from dpo_sweep.sweep import signals

    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signum)  # SIG_DFL, or what an earlier test's ray.init left installed
    with signals.stop_signals_raise():  # what `run` installs from its first import
        request = StopRequest()
        with stopping.stop_on_sigint(request):
            os.kill(os.getpid(), signum)  # handled: the sweep stops at Tune's next turn
            assert request.interrupted and request.signum == signum
            with pytest.raises(KeyboardInterrupt) as err:
                os.kill(os.getpid(), signum)
        assert signals.exit_code(signals.signum_of(err.value)) == 128 + signum
    assert signal.getsignal(signum) is before


def test_tune_failure_logs_are_dropped_once_stopping(caplog):
    request = StopRequest()
    log = logging.getLogger(stopping.TUNE_TRIAL_LOGGERS[0])
    with caplog.at_level(logging.ERROR), stopping.quiet_tune_once_stopping(request):
        log.error("a real failure")
        request.reason = stopping.INTERRUPTED
        log.error("Trial task failed for trial tune_trainable_00001")
    assert [r.getMessage() for r in caplog.records] == ["a real failure"]


def _trial(tune_id: str, trial_id: str):
    return type("T", (), {"trial_id": tune_id, "config": {"trial_id": trial_id}})()


def _searcher(plan, rec, *hooks):
    """The planner's Searcher over ``plan``, with ``hooks`` after each trial's end, and the ETA's pricing first."""
    from dpo_sweep.sweep.planner import PlanSearcher
    from dpo_sweep.sweep.task import TrialTask

    return PlanSearcher(plan, rec, TrialTask(make_cfg()), end_hooks=(rec.pricing.trial_ended, *hooks))


def _start(searcher, tune_id: str):
    """The next trial the Searcher suggests, as Tune's trial ``tune_id``."""
    from dpo_sweep.sweep.task import trial_id_of

    return _trial(tune_id, trial_id_of(searcher.suggest(tune_id)))


def test_the_stop_hook_asks_for_the_stop_after_two_alike_failures_and_no_row_is_written_for_killed_trials(tmp_path, capsys):
    from dpo_sweep.plan.schedule import SweepPlan

    cfgs = [make_cfg(trial_id=f"t00{i}") for i in range(3)]
    plan = SweepPlan(cfgs, full_grid=True)  # one Ray trial per configuration, in order
    request = StopRequest()
    rec = recorder.SweepRecorder(tmp_path, plan, total=3, already_done=0, stop=request)
    searcher = _searcher(plan, rec, stopping.SameFailureStop(request, 3).trial_ended)
    failed = [TrialEnding(TrialFailure("error", LIGER)).to_report()]
    assert (a := _start(searcher, "a")).config["trial_id"] == "t000"
    end_trial(rec, searcher, a, failed)
    assert request.reason is None
    assert (b := _start(searcher, "b")).config["trial_id"] == "t001"
    end_trial(rec, searcher, b, failed)
    assert request.reason == LIGER
    assert (c := _start(searcher, "c")).config["trial_id"] == "t002"
    end_trial(rec, searcher, c, error=True)  # the third trial, killed by the stop
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [r["trial_id"] for r in rows] == ["t000", "t001"] and rec.crashed == []
    assert "[2/3] t001" in capsys.readouterr().out


def _ended(kind, cost_s, measure_s, tokens, once_s=0.0, micro_batch=1, level="none", warmup_s=0.0):
    from dpo_sweep.sweep.estimate import EndedTrial

    return EndedTrial(kind, cost_s, measure_s, once_s, tokens, micro_batch, level, warmup_s)


def _step(ms, measured=True, worst_case=False):
    from dpo_sweep.records import StepRecord

    return StepRecord(trial_id="t", step=0, loss=0.5, grad_norm=1.0, step_time_ms=ms, peak_mem_gb=1.0,
                      reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0,
                      measured=measured, worst_case=worst_case)


def test_the_first_trials_once_costs_leave_its_fixed_cost_and_its_pace():
    """The H200 user case's first trial: 51 s, of which its model phase (the weights' first read,
    the shared reference pass) and its warm-up step's kernel compile are paid once; counted in
    every trial's price they put the first ETA 2.6x over the truth."""
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.records import TrialResult
    from dpo_sweep.sweep.estimate import EndedTrial, SweepEstimate, trial_tokens, warmup_excess_s

    steps = [_step(9000.0, measured=False), _step(3000.0), _step(4000.0), _step(2000.0), _step(8000.0, worst_case=True)]
    assert warmup_excess_s(steps) == pytest.approx(6.0)  # 9 s less the measured steps' median 3 s
    assert warmup_excess_s(steps[1:]) == 0.0 and warmup_excess_s([]) == 0.0
    assert warmup_excess_s([_step(1000.0, measured=False), _step(3000.0)]) == 0.0  # never below 0
    cfg = make_cfg(micro_batch=1, checkpoint_level="full", grad_acc=2, steps=4)
    result = TrialResult(trial_id="t", status="ok", **cfg.knobs(), measure_s=26.0, startup_import_s=1.0, startup_data_s=1.0,
                         startup_model_s=12.0)
    first = EndedTrial.of(JobKind.MEASURE, cfg, result, 51.0, steps)
    assert (first.once_s, first.warmup_s, first.micro_batch, first.level) == (14.0, 6.0, 1, "full")
    est = SweepEstimate()
    est.add(first)
    assert est.fixed_s() == pytest.approx(51.0 - 26.0 - 14.0)  # the steps' 26 s hold the warm-up's 6 s
    assert est.pace_s_per_token() == pytest.approx(20.0 / trial_tokens(cfg))
    est.add(_ended(JobKind.MEASURE, 12.0, 9.0, trial_tokens(cfg), micro_batch=1, level="full", warmup_s=2.0))
    assert est.fixed_s() == 3.0  # a later trial's own: nothing left out of it
    assert est.pace_s_per_token() == pytest.approx(14.5 / trial_tokens(cfg))
    assert est.trial_s(Due(cfg, JobKind.MEASURE, math.nan)) == pytest.approx(3.0 + 14.5)


def test_an_unmeasured_measurement_is_priced_at_the_pace_of_its_nearest_measured_configurations():
    """On the H200 user case micro-batch 1 ran its tokens up to 1.9x slower than 2-8: the pace of
    the first measurement (mb 1, level full) priced the larger micro-batches 1.9x high."""
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.sweep.estimate import SweepEstimate

    est = SweepEstimate()
    est.add(_ended(JobKind.MEASURE, 13.0, 12.0, 1000, micro_batch=1, level="full"))  # 0.012 s a token
    est.add(_ended(JobKind.MEASURE, 8.0, 7.0, 1000, micro_batch=2, level="full"))    # 0.007
    est.add(_ended(JobKind.MEASURE, 7.0, 6.0, 1000, micro_batch=2, level="L1"))      # 0.006
    pace = lambda **kw: est.pace_s_per_token(like=make_cfg(**kw))  # noqa: E731
    assert pace(micro_batch=1, checkpoint_level="L2") == pytest.approx(0.012)  # same micro-batch
    assert pace(micro_batch=2, checkpoint_level="L2") == pytest.approx(0.006)  # the nearest level: L1
    assert pace(micro_batch=2, checkpoint_level="L3") == pytest.approx(0.007)  # full
    assert pace(micro_batch=8, checkpoint_level="full") == pytest.approx(0.007)  # nearest micro-batch, same level
    assert pace(micro_batch=4, checkpoint_level="none") == pytest.approx(0.006)  # nearest micro-batch, nearest level
    cfg = make_cfg(micro_batch=4, checkpoint_level="full", grad_acc=2, steps=3)
    assert est.trial_s(Due(cfg, JobKind.MEASURE, math.nan)) == pytest.approx(est.fixed_s() + 0.007 * 3 * 2 * 4 * 64)


def test_one_measured_micro_batch_prices_no_other_one():
    """The H200 user case's first measurement, mb 1, priced the rest 69% high from its pace alone:
    until a second micro-batch size is measured, what is left is not known (``~? left``), unless
    everything left runs the measured micro-batch."""
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.sweep.estimate import SweepEstimate

    est = SweepEstimate()
    est.add(_ended(JobKind.MEASURE, 13.0, 12.0, 1000, micro_batch=1, level="full"))
    same, other = (Due(make_cfg(micro_batch=mb, checkpoint_level="L1"), JobKind.MEASURE, math.nan) for mb in (1, 2))
    learn = Due(make_cfg(micro_batch=2, grad_acc=4), JobKind.LEARN, math.nan)
    assert math.isfinite(est.left_s([same], []))
    assert math.isnan(est.left_s([same, other], [])) and math.isnan(est.left_s([same], [(learn, 5.0)]))
    assert math.isfinite(est.left_s([same], [(Due(other.cfg, JobKind.RUNOFF, 500.0), 5.0)]))  # its step time known
    est.add(_ended(JobKind.MEASURE, 8.0, 7.0, 1000, micro_batch=4, level="full"))
    assert math.isfinite(est.left_s([same, other], [(learn, 5.0)]))


def test_what_is_left_is_priced_trial_by_trial():
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.sweep.estimate import REFERENCE_SHARE, SweepEstimate, trial_tokens

    est = SweepEstimate()
    measure = make_cfg(trial_id="m", grad_acc=2, micro_batch=2, steps=3)  # 3 x 2 x 2 x 64 tokens
    assert trial_tokens(measure) == 3 * 2 * 2 * 64
    assert math.isnan(est.left_s([Due(measure, JobKind.MEASURE, math.nan)], []))  # nothing ended: unknown
    # The first trial (cold): 30 s, 6 s of steps, 15 s of imports and tokenising a warm worker skips.
    est.add(_ended(JobKind.MEASURE, 30.0, 6.0, trial_tokens(measure), once_s=15.0, micro_batch=2))
    assert est.fixed_s() == 9.0 and est.pace_s_per_token() == pytest.approx(6.0 / 768)
    assert est.trial_s(Due(measure, JobKind.MEASURE, math.nan)) == pytest.approx(9.0 + 6.0)
    # Later trials give the fixed cost themselves: the median of theirs, the first's left out.
    est.add(_ended(JobKind.MEASURE, 10.0, 6.0, 768, micro_batch=2))
    est.add(_ended(JobKind.MEASURE, 12.0, 6.0, 768, micro_batch=2))
    assert est.fixed_s() == 5.0
    # A learning trial of a measured configuration: its steps at that step time (no worst-case
    # step), and the reference pass of its pairs; a runoff: its steps only.
    learn = make_cfg(trial_id="l", grad_acc=8, micro_batch=2, steps=16, worst_case_step=False, reference="precomputed")
    assert est.trial_s(Due(learn, JobKind.LEARN, 500.0)) == pytest.approx(5.0 + 16 * 0.5 * (1 + REFERENCE_SHARE))
    runoff = make_cfg(trial_id="r", grad_acc=8, micro_batch=2, steps=4, worst_case_step=True)
    assert est.trial_s(Due(runoff, JobKind.RUNOFF, 500.0)) == pytest.approx(5.0 + 5 * 0.5)  # with its worst case
    # Running trials count less what they ran, never below 0; two at a time halve it.
    due = [Due(runoff, JobKind.RUNOFF, 500.0)]
    assert est.left_s(due, [(Due(runoff, JobKind.RUNOFF, 500.0), 4.0)]) == pytest.approx(7.5 + 3.5)
    assert est.left_s(due, [(Due(runoff, JobKind.RUNOFF, 500.0), 60.0)]) == pytest.approx(7.5)
    assert est.left_s(due, [], concurrent=2) == pytest.approx(3.75)
    assert est.left_s([], []) == 0.0
    assert [recorder.duration(s) for s in (42.4, 185, 3720, math.nan)] == ["42 s", "3 min 05 s", "1 h 02 min", "?"]


def test_an_unmeasured_learning_trial_or_runoff_is_priced_at_the_fastest_measured_pace():
    """The plan runs learning trials and runoffs on the fastest rows: the median pace of slow
    measurements (mb 1 at level full, first on the H200) priced them 50% high."""
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.sweep.estimate import SweepEstimate, trial_tokens

    est = SweepEstimate()
    for measure_s in (12.0, 6.0, 9.0):  # three measure trials of 1,000 tokens; median 9 s, fastest 6 s
        est.add(_ended(JobKind.MEASURE, measure_s + 1.0, measure_s, 1000))
    cfg = make_cfg(grad_acc=4, steps=3, worst_case_step=False)
    for kind in (JobKind.LEARN, JobKind.RUNOFF):
        assert est.trial_s(Due(cfg, kind, math.nan)) == pytest.approx(1.0 + 0.006 * trial_tokens(cfg))
    assert est.trial_s(Due(cfg, JobKind.MEASURE, math.nan)) == pytest.approx(1.0 + 0.009 * trial_tokens(cfg))


def test_trials_that_failed_before_a_step_price_what_is_left_by_their_whole_cost():
    from dpo_sweep.plan.jobs import Due, JobKind
    from dpo_sweep.sweep.estimate import SweepEstimate

    est = SweepEstimate()
    est.add(_ended(JobKind.MEASURE, 10.0, math.nan, 1000))
    cfg = make_cfg(grad_acc=4, steps=3)
    assert est.fixed_s() == 0.0 and est.trial_s(Due(cfg, JobKind.MEASURE, math.nan)) == pytest.approx(0.01 * 3 * 4 * 64)


def test_progress_line_left_counts_longer_trials_longer(tmp_path, capsys, monkeypatch):
    """A sweep whose last two trials accumulate 4 micro-steps where the first two took 1: after the
    second row, 2 x 4 x one trial's 10 s are left."""
    from dpo_sweep.plan.schedule import SweepPlan

    trials = [make_cfg(trial_id=f"t{i}", grad_acc=ga, beta=0.1 + i / 10) for i, ga in enumerate((1, 1, 4, 4))]
    plan = SweepPlan(trials, full_grid=True)
    clock = [0.0]
    monkeypatch.setattr(recorder.time, "monotonic", lambda: clock[0])
    rec = recorder.SweepRecorder(tmp_path, plan, total=4, already_done=0)
    searcher = _searcher(plan, rec)
    for tune_id in ("a", "b"):
        trial = _start(searcher, tune_id)
        rec.on_trial_start(0, [], trial)
        clock[0] += 10.0
        end_trial(rec, searcher, trial, [TrialEnding(TrialFailure("error", "x")).to_report()])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert "[2/4] t1" in lines[1] and "20 s elapsed, ~1 min 20 s left" in lines[1], lines


def test_progress_line_has_elapsed_and_what_is_left():
    from dpo_sweep.records import failed_result

    result = failed_result(make_cfg(trial_id="t003"), "error", "boom")
    line = recorder.progress_line(2, 5, result, elapsed_s=65, left_s=97.6)
    assert line.startswith("[2/5] t003") and "1 min 05 s elapsed, ~1 min 38 s left" in line
    assert line.endswith("| boom")


def test_worker_output_goes_to_the_trial_log_file_at_the_descriptor_level(tmp_path):
    path = trial_run.worker_log_path(str(tmp_path / "logs"), "t000", 0)
    assert path == tmp_path / "logs" / "t000.log"
    assert trial_run.worker_log_path(str(tmp_path), "t000", 1).name == "t000.rank1.log"
    code = ("import os, subprocess, sys\n"
            "from pathlib import Path\n"
            "from dpo_sweep.sweep.trial_run import output_to_file\n"
            f"with output_to_file(Path({str(path)!r})):\n"
            "    print('python stdout'); print('python stderr', file=sys.stderr)\n"
            "    os.write(2, b'fd 2 (C++ warnings)\\n')\n"
            "    subprocess.run([sys.executable, '-c', 'print(\"a child process\")'])\n"
            "print('after the block')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(trial_run.__file__).parents[2])})
    assert done.returncode == 0, done.stderr
    assert path.read_text().splitlines() == ["python stdout", "python stderr", "fd 2 (C++ warnings)",
                                             "a child process"]
    assert done.stdout == "after the block\n" and done.stderr == ""


def test_token_command_is_the_ray_script_next_to_this_python():
    script = Path(sys.executable).with_name("ray")
    want = f"{script} get-auth-token" if script.is_file() else f"{sys.executable} -m ray.scripts.scripts get-auth-token"
    cmd = auth_token_command()
    assert cmd == want
    done = subprocess.run([*cmd.split()[:-1], "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "get-auth-token" in done.stdout


def test_interrupted_line_gives_a_resume_command_a_shell_can_run():
    line = stopping.interrupted_line(2, 6, stopping.resume_command("my spaces/q.yaml", "reports/q"))
    assert line == ("interrupted: 2 of 6 trials finished; continue with: "
                    "dpo-sweep run 'my spaces/q.yaml' --output reports/q --resume")


def test_rows_written_when_measured_count_their_learning_trial_in_what_is_left(tmp_path, capsys, monkeypatch):
    """Each row is written when its measurement ends, and the estimate of what is left counts the
    learning trial its stability still waits for (it used to say ~0 s left with that trial to run);
    when the learning trial ends, the console says the rows' stability."""
    from dpo_sweep.plan.jobs import JobKind
    from dpo_sweep.plan.schedule import SweepPlan
    from tests.plan.test_plan_schedule import estimate

    trials = [make_cfg(trial_id=f"t{i}", grad_acc=4, checkpoint_level=level) for i, level in enumerate(("none", "L1", "L2"))]
    plan = SweepPlan(trials, estimate=estimate)
    clock = [0.0]
    monkeypatch.setattr(recorder.time, "monotonic", lambda: clock[0])
    rec = recorder.SweepRecorder(tmp_path, plan, total=3, already_done=0)
    searcher = _searcher(plan, rec)
    kinds = []
    while isinstance(config := searcher.suggest(tune_id := f"tune-{len(kinds)}"), dict):
        job = plan.job(config["trial_id"])
        kinds.append(job.kind)
        trial = _trial(tune_id, job.cfg.trial_id)
        rec.on_trial_start(0, [], trial)
        clock[0] += 10.0
        row = TrialResult(trial_id=job.cfg.trial_id, status="ok", **job.cfg.knobs(), peak_mem_gb=1.0)
        end_trial(rec, searcher, trial, [OutcomeReport(row).to_report(), TrialEnding().to_report()])
    assert kinds[-1] == JobKind.LEARN
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("[")]
    assert len(lines) == 3 and not any(line.endswith("elapsed, ~0 s left") for line in lines), lines
    stability = [line for line in out if line.startswith("  stability of ")]
    assert len(stability) == 1 and stability[0].startswith("  stability of t0, t1, t2 from t"), out
    # The measure trials wrote their rows; the learning trial ended without one of its own.
    ended = [line for line in out if line.startswith("  trial ")]
    assert len(ended) == 1
    assert ended[0].split()[1].endswith("-learning") and "(learn, grad_acc 4)" in ended[0]


def test_what_is_left_asks_the_plan_for_the_trials_due_and_the_running_ones(tmp_path, monkeypatch):
    from dpo_sweep.plan.jobs import Due, JobKind

    full = make_cfg(trial_id="t2-learning", grad_acc=8, micro_batch=2, steps=3, worst_case_step=False,
                    reference="precomputed")
    runoff = make_cfg(trial_id="t1-runoff", grad_acc=8, micro_batch=2, steps=3, worst_case_step=False)

    class Plan:
        def trials_due(self):
            return [Due(full, JobKind.LEARN, 1000.0)]

        def running_due(self):
            return {"t1-runoff": Due(runoff, JobKind.RUNOFF, 1000.0)}

    monkeypatch.setattr(recorder.time, "monotonic", lambda: 100.0)
    rec = recorder.SweepRecorder(tmp_path, Plan(), total=3, already_done=2)
    rec.estimate.add(_ended(JobKind.MEASURE, 2.0, 1.0, 1000))  # 1 s outside the steps
    rec.trial_started["t1-runoff"] = 99.0  # running for 1 s of its 1 + 3 x 1 s
    # the learning trial: 1 + 3 s of steps + its reference pass (precomputed); the runoff: 3 s more
    assert rec.left_s() == pytest.approx((1 + 3 + 0.25 * 3) + 3)


def test_a_job_handed_out_but_not_started_yet_counts_whole_in_what_is_left(tmp_path, monkeypatch):
    """On the H200 the ETA fell from ~3 min to ~1 min 28 s between the last measurement and the
    learning trial's start: the plan had handed it out (not due any more) and Tune had not started it."""
    from dpo_sweep.plan.jobs import Due, JobKind

    learning = make_cfg(trial_id="t2-learning", grad_acc=8, micro_batch=2, steps=3, worst_case_step=False)

    class Plan:
        def trials_due(self):
            return []

        def running_due(self):
            return {"t2-learning": Due(learning, JobKind.LEARN, 1000.0)}

    monkeypatch.setattr(recorder.time, "monotonic", lambda: 100.0)
    rec = recorder.SweepRecorder(tmp_path, Plan(), total=3, already_done=2)
    rec.estimate.add(_ended(JobKind.MEASURE, 2.0, 1.0, 1000))  # 1 s outside the steps
    assert rec.left_s() == pytest.approx(1 + 3)  # not started: the whole trial
    rec.trial_started["t2-learning"] = 99.0
    assert rec.left_s() == pytest.approx(1 + 3 - 1)
