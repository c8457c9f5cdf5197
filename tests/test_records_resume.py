"""``--resume`` into a results.csv written with another column set: appending widens the header,
so every cell stays under its own column's name and the readers read both rows."""
from __future__ import annotations

import csv
import math

from dpo_sweep.analysis.results import load_results
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import RESULTS_COLUMNS, TrialResult, read_csv_rows, write_results
from dpo_sweep.sweep.recorder import SweepRecorder
from testkit import make_cfg

#: A results.csv of an older version: no planner or stability columns, and a swept field
#: (``padding_free``) the resumed space no longer sweeps.
OLD_HEADER = [c for c in RESULTS_COLUMNS if c not in ("predicted_peak_gb", "measured_by", "stability",
                                                     "step_time_source", "stability_from")] + ["padding_free"]


def _old_results(path, trial_id: str = "old") -> dict[str, str]:
    row = {c: "" for c in OLD_HEADER}
    row.update(trial_id=trial_id, status="ok", model="preset:tiny-llama", seq_len="64", micro_batch="2",
               checkpoint_level="none", grad_acc="1", beta="0.1", workers_per_trial="1", effective_batch="2",
               peak_mem_gb="1.25", step_time_ms="40.0", error="", padding_free="True")
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=OLD_HEADER)
        w.writeheader()
        w.writerow(row)
    return row


def _new_row(cfg) -> TrialResult:
    return TrialResult(trial_id=cfg.trial_id, status="ok", **cfg.knobs(), peak_mem_gb=2.5, step_time_ms=80.0,
                       predicted_peak_gb=2.75, measured_by=cfg.trial_id, stability="stable",
                       extra={"group_by_length": True})


def test_appending_to_an_older_header_keeps_every_cell_under_its_name(tmp_path):
    old = _old_results(tmp_path / "results.csv")
    cfg = make_cfg(trial_id="new", micro_batch=4)
    added = write_results(tmp_path, [_new_row(cfg)], append=True)
    rows = {r["trial_id"]: r for r in read_csv_rows(tmp_path / "results.csv")}
    assert set(rows) == {"old", "new"}
    assert {c: rows["old"][c] for c in OLD_HEADER} == old  # nothing of the old row lost or moved
    assert (rows["old"]["predicted_peak_gb"], rows["old"]["measured_by"], rows["old"]["group_by_length"]) == ("", "", "")
    new = rows["new"]
    assert (new["micro_batch"], new["peak_mem_gb"], new["predicted_peak_gb"], new["measured_by"]) == ("4", "2.5", "2.75", "new")
    assert (new["stability"], new["group_by_length"], new["padding_free"], new["error"]) == ("stable", "True", "", "")
    df = load_results(tmp_path).set_index("trial_id")  # the analysis and the report read it
    assert df.loc["old", "peak_mem_gb"] == 1.25 and math.isnan(df.loc["old", "predicted_peak_gb"])
    assert df.loc["new", "predicted_peak_gb"] == 2.75 and df.loc["new", "measured_by"] == "new"
    assert set(added) == {"predicted_peak_gb", "measured_by", "step_time_source", "stability", "stability_from",
                          "group_by_length"}
    assert write_results(tmp_path, [_new_row(make_cfg(trial_id="third"))], append=True) == []  # widened once
    assert [r["trial_id"] for r in read_csv_rows(tmp_path / "results.csv")] == ["old", "new", "third"]


def test_appending_fewer_columns_than_the_file_has_leaves_the_header(tmp_path):
    write_results(tmp_path, [_new_row(make_cfg(trial_id="a"))])
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    plain = TrialResult(trial_id="b", status="ok", **make_cfg().knobs(), peak_mem_gb=3.0)  # no swept column
    assert write_results(tmp_path, [plain], append=True) == []
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == header
    rows = read_csv_rows(tmp_path / "results.csv")
    assert (rows[1]["trial_id"], rows[1]["peak_mem_gb"], rows[1]["group_by_length"]) == ("b", "3.0", "")


def test_the_sweep_says_when_it_widened_the_header(tmp_path, capsys):
    _old_results(tmp_path / "results.csv")
    cfg = make_cfg(trial_id="tiny-card", resources={"use_gpu": False, "gpu_memory_gb": 0.001})
    plan = SweepPlan([cfg])
    rec = SweepRecorder(tmp_path, plan, total=2, already_done=1)
    assert plan.next_job() is None  # pruned over the 1 MB card: a row, no trial
    rec.flush()
    out = capsys.readouterr().out
    assert f"{tmp_path / 'results.csv'}: its header lacked" in out and "predicted_peak_gb" in out
    rows = {r["trial_id"]: r for r in read_csv_rows(tmp_path / "results.csv")}
    assert rows["tiny-card"]["status"] == "pruned" and rows["old"]["peak_mem_gb"] == "1.25"


def test_resume_dropping_orphan_steps_keeps_an_older_steps_file_s_own_columns(tmp_path):
    from dpo_sweep.sweep.output_dir import prepare_output

    space = tmp_path / "space.yaml"
    space.write_text("name: x\n")
    _old_results(tmp_path / "results.csv", trial_id="done")
    header = ["trial_id", "step", "loss", "old_signal"]  # a column this version no longer writes
    (tmp_path / "steps.csv").write_text(",".join(header) + "\ndone,1,0.69,7\norphan,1,0.70,8\n")
    assert prepare_output(space, tmp_path, resume=True) == {"done"}
    rows = read_csv_rows(tmp_path / "steps.csv")
    assert [(r["trial_id"], r["loss"], r["old_signal"]) for r in rows] == [("done", "0.69", "7")]
