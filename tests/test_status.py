"""dpo_sweep/core/status.py: a results row's status and step-time source as enums whose values are
the text results.csv holds, so the file's text is what it always was and a cell read back equals
its member."""
import json
import subprocess
import sys

import pandas as pd

from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.records import TrialResult, read_csv_rows, rows_as, write_results
from testkit import make_cfg


def test_the_values_are_the_csv_text():
    assert [s.value for s in Status] == ["ok", "oom", "diverged", "error", "pruned", "timeout", "stopped"]
    assert [s.value for s in TimeSource] == ["measured", "extrapolated", "runoff", "modelled"]
    assert Status.of("oom") is Status.OOM and Status.of("OOM") is None and Status.of(float("nan")) is None


def test_a_member_writes_as_its_text_and_equals_the_cell_read_back(tmp_path):
    from dpo_sweep.records import failed_result

    oom = failed_result(make_cfg(trial_id="t0"), Status.OOM, "out of memory")
    ok = TrialResult(trial_id="t1", status=Status.OK, model="tiny-llama", seq_len=64, micro_batch=1,
                     checkpoint_level="none", grad_acc=1, beta=0.1, workers_per_trial=1, effective_batch=1,
                     step_time_source=TimeSource.EXTRAPOLATED)
    write_results(tmp_path, [oom, ok])
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[1].split(",")[:2] == ["t0", "oom"] and lines[2].split(",")[:2] == ["t1", "ok"]
    assert ",extrapolated," in lines[2] and "Status" not in (tmp_path / "results.csv").read_text()
    back = rows_as(TrialResult, read_csv_rows(tmp_path / "results.csv"))
    assert [type(r.status) for r in back] == [str, str]
    assert back[0].status == Status.OOM and back[1].status == Status.OK
    assert back[1].step_time_source == TimeSource.EXTRAPOLATED
    assert json.dumps({"status": Status.OK}) == '{"status": "ok"}' and f"{Status.PRUNED}" == "pruned"


def test_a_member_compares_with_a_column_read_from_csv():
    df = pd.DataFrame({"status": ["ok", "oom", "pruned", "ok"]})
    assert (df["status"] == Status.OK).tolist() == [True, False, False, True]
    assert df["status"].isin([Status.OOM, Status.PRUNED]).tolist() == [False, True, True, False]
    assert (df["status"].to_numpy() != Status.OK).tolist() == [False, True, True, False]


def test_it_imports_with_the_standard_library_only():
    code = "import sys; import dpo_sweep.core.status; print(sorted(m for m in sys.modules if m.startswith('dpo_sweep')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['dpo_sweep', 'dpo_sweep.core', 'dpo_sweep.core.status']"
