"""The result schema's one constructor for failed rows, used by the trainer and the sweep alike."""
from __future__ import annotations

import math

import torch

from dpo_sweep.records import RESULTS_COLUMNS, StepRecord, error_text, failed_result
from testkit import make_cfg


def _step(step: int, peak: float) -> StepRecord:
    return StepRecord(trial_id="t", step=step, loss=0.69, grad_norm=1.0, step_time_ms=10.0, peak_mem_gb=peak,
                      reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0)


def test_failed_result_carries_the_knobs_the_setup_and_what_the_steps_tell():
    cfg = make_cfg(trial_id="t", micro_batch=2, grad_acc=3, loss="hinge", precision="bf16-mixed")
    r = failed_result(cfg, "oom", "rank 0: OOM", [_step(1, 2.5), _step(2, math.nan)], startup_s=4.0, measure_s=0.5)
    assert (r.trial_id, r.status, r.error, r.micro_batch, r.grad_acc, r.effective_batch) == ("t", "oom", "rank 0: OOM", 2, 3, 6)
    assert (r.loss_type, r.precision, r.reference, r.attn_implementation) == (
        "hinge", "bf16-mixed", cfg.train.reference, cfg.model.attn_implementation)
    assert (r.steps, r.peak_mem_gb, r.startup_s, r.measure_s) == (2, 2.5, 4.0, 0.5)
    nothing = failed_result(cfg, "error", "x")
    assert nothing.steps == 0 and math.isnan(nothing.peak_mem_gb) and math.isnan(nothing.startup_s)


def test_error_text_is_the_type_and_the_first_line_bounded():
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail")
    assert error_text(err) == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    assert error_text(RuntimeError()) == "RuntimeError: "
    assert len(error_text(ValueError("x" * 2000))) == 500


def test_the_results_columns_are_the_contract_ones_in_order():
    contract = ["trial_id", "status", "model", "seq_len", "micro_batch", "checkpoint_level", "grad_acc", "beta",
                "workers_per_trial", "effective_batch", "parallelism", "peak_mem_gb", "torch_peak_alloc_gb", "torch_peak_reserved_gb",
                "step_time_ms", "step_time_p90_ms", "tokens_per_s", "mfu", "loss_mean", "loss_std",
                "grad_norm_mean", "reward_accuracy", "reward_margin", "error"]
    assert RESULTS_COLUMNS[:len(contract)] == contract


def test_rows_read_back_are_the_rows_written(tmp_path):
    """records.rows_as: results.csv and steps.csv rows back in their dataclasses, swept columns
    in ``extra`` (what --resume restores and the extrapolation benchmark re-fits from)."""
    import math

    from dpo_sweep.records import StepRecord, TrialResult, read_csv_rows, rows_as, write_results, write_steps

    row = TrialResult(trial_id="t0", status="ok", model="tiny-llama", seq_len=64, micro_batch=2,
                      checkpoint_level="L1", grad_acc=4, beta=0.1, workers_per_trial=1, effective_batch=8,
                      peak_mem_gb=1.5, liger_kernel=True, rollback_step=None, stability="pending", extra={"lr": "1e-05"})
    step = StepRecord(trial_id="t0", step=3, loss=0.6, grad_norm=1.0, step_time_ms=12.5, peak_mem_gb=1.0,
                      reward_accuracy=0.5, reward_margin=0.1, logps_chosen=-1.0, logps_rejected=-2.0, kl=0.0,
                      measured=False, worst_case=True, micro_ms="1.5,2.25")
    write_results(tmp_path, [row])
    write_steps(tmp_path, [step])
    (back,) = rows_as(TrialResult, read_csv_rows(tmp_path / "results.csv"))
    assert back == row and back.extra == {"lr": "1e-05"} and math.isnan(back.step_time_ms)
    (again,) = rows_as(StepRecord, read_csv_rows(tmp_path / "steps.csv"))
    assert again == step
