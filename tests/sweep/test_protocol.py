"""The trial protocol (sweep/protocol.py): every message comes back from its report as it went,
NaN included, and a report is read only by the message it carries."""
from __future__ import annotations

import math

import pytest
import torch

from dpo_sweep.records import StepRecord, TrialResult
from dpo_sweep.sweep.protocol import (MAX_ERROR_CHARS, OutcomeReport, StepReport, TrialEnding, TrialFailure,
                                      short_error)
from testkit import make_cfg

MESSAGES = (StepReport, OutcomeReport, TrialEnding)


def _step(loss: float = 0.69) -> StepRecord:
    return StepRecord(trial_id="t0", step=3, loss=loss, grad_norm=1.0, step_time_ms=100.0, peak_mem_gb=1.5,
                      reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-10.0, logps_rejected=-10.0, kl=0.0,
                      logratio_mean=0.0)


def test_a_step_report_round_trips_with_its_clock():
    report = StepReport(_step(loss=math.nan), startup_s=9.5, measure_s=0.25)
    back = StepReport.from_report(report.to_report())
    assert (back.startup_s, back.measure_s) == (9.5, 0.25)
    assert math.isnan(back.record.loss) and back.record.step == 3
    assert back == StepReport(back.record, 9.5, 0.25)


def test_an_outcome_report_round_trips_its_row_and_machine():
    cfg = make_cfg(trial_id="t0")
    result = TrialResult(trial_id="t0", status="ok", **cfg.knobs(), peak_mem_gb=1.5)
    back = OutcomeReport.from_report(OutcomeReport(result, {"hostname": "h"}).to_report())
    assert back.result.peak_mem_gb == 1.5 and back.environment == {"hostname": "h"}
    assert math.isnan(back.result.step_time_ms)


@pytest.mark.parametrize("ending", [
    TrialEnding(wall_s=3.0),
    TrialEnding(TrialFailure("oom", "rank 0: Tried to allocate 2 GiB", peak_mem_gb=79.0), wall_s=4.0),
    TrialEnding(TrialFailure("error", "rank 1: ValueError: bad")),
])
def test_an_ending_round_trips(ending):
    back = TrialEnding.from_report(ending.to_report())
    assert back.status == ending.status and _same(back.wall_s, ending.wall_s)
    if ending.failure is not None:
        assert (back.failure.status, back.failure.error) == (ending.failure.status, ending.failure.error)
        assert _same(back.failure.peak_mem_gb, ending.failure.peak_mem_gb)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_a_report_is_read_only_by_its_own_message():
    reports = [StepReport(_step()).to_report(), OutcomeReport(TrialResult(
        trial_id="t0", status="ok", **make_cfg().knobs())).to_report(), TrialEnding().to_report()]
    for i, report in enumerate(reports):
        read = [cls.from_report({**report, "trial_id": "tune-id"}) is not None for cls in MESSAGES]
        assert read == [j == i for j in range(len(MESSAGES))]


def test_a_warm_worker_s_failure_names_rank_0_as_ray_train_does():
    failure = TrialFailure.from_exception(torch.OutOfMemoryError("Tried to allocate 1 GiB"), rank=0)
    assert (failure.status, failure.error) == ("oom", "rank 0: Tried to allocate 1 GiB")
    assert failure.process_usable and math.isnan(failure.peak_mem_gb)
    error = TrialFailure.from_exception(RuntimeError("CUDA error: an illegal memory access"), rank=0)
    assert error.error == "rank 0: RuntimeError: CUDA error: an illegal memory access"
    assert not error.process_usable


def test_error_text_is_one_line_and_capped():
    assert short_error("a\n  b") == "a b"
    long = short_error("x" * (MAX_ERROR_CHARS + 10))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("...")
