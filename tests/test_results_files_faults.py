"""Results files as a user's bad day leaves them, read and written by `dpo-sweep` in its own process:
a spreadsheet's BOM or encoding, an over-long cell, impossible values, a full disk (a real tmpfs
of a few kilobytes) and a read-only folder. Each is read as the contract says or refused in one
line with the fix; no output file is ever left cut."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "analysis"))

from sweep_frames import steps_for, trial, write_dir  # noqa: E402

from dpo_sweep.records import StepRecord, read_csv_rows, rewrite_csv, write_steps  # noqa: E402
from dpo_sweep.sweep.output_dir import prepare_output  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def dpo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpo_sweep", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd or REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def results(tmp_path: Path, name: str = "r") -> Path:
    rows = [trial("ta000_mb1_none_ga1_b0.1", 5.0, 100.0, 0.02, mb=1),
            trial("tb000_mb2_none_ga1_b0.1", 7.0, 80.0, 0.02, mb=2)]
    out = write_dir(tmp_path / name, rows)
    write_steps(out, [s for r in rows for s in steps_for(r.trial_id, 3, 5.0)])
    return out


def test_a_spreadsheet_s_bom_is_read_and_resume_doubles_nothing(tmp_path):
    out = results(tmp_path)
    for name in ("results.csv", "steps.csv"):
        path = out / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    space = tmp_path / "s.yaml"
    space.write_text("name: s\n")
    assert prepare_output(space, out, resume=True) == {"ta000_mb1_none_ga1_b0.1", "tb000_mb2_none_ga1_b0.1"}
    assert len(read_csv_rows(out / "steps.csv")) == 6
    report = dpo("report", str(out), "--memory-budget-gb", "40")
    assert report.returncode == 0, report.stderr[-2000:]


@pytest.mark.parametrize("encoding, said", [("latin-1", "not UTF-8 text (line 2"),
                                            ("utf-16", "UTF-16 text")])
def test_another_encoding_is_refused_with_the_fix(tmp_path, encoding, said):
    out = results(tmp_path)
    path = out / "results.csv"
    text = path.read_text().replace("tiny-llama", "tiny-llamä", 2)
    path.write_bytes(text.encode(encoding))
    for command in (["report", str(out)], ["recommend", str(out), "--memory-budget-gb", "40"]):
        proc = dpo(*command)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert said in proc.stderr and 'save it as "CSV UTF-8"' in proc.stderr and "Traceback" not in proc.stderr


def test_a_cell_over_the_csv_limit_is_refused_not_a_traceback(tmp_path):
    out = results(tmp_path)
    rows = read_csv_rows(out / "results.csv")
    rows[0]["error"] = "x" * 140_000  # a hand edit, or a file another tool wrote
    rewrite_csv(out / "results.csv", rows, list(rows[0]))
    proc = dpo("report", str(out))
    assert proc.returncode == 2 and "line 2 cannot be read as CSV (field larger than field limit" in proc.stderr, \
        proc.stderr[-2000:]
    assert len(proc.stderr) < 1000


def test_a_long_error_is_written_shortened(tmp_path):
    out = write_dir(tmp_path / "r", [trial("t1_mb1", status="error", error="boom " * 100_000)])
    assert len(read_csv_rows(out / "results.csv")[0]["error"]) < 5000


@pytest.mark.parametrize("column, value, said", [
    ("peak_mem_gb", "-5", "column peak_mem_gb: -5 is not allowed; it is 0 or more"),
    ("tokens_per_s", "-1000", "column tokens_per_s: -1000 is not allowed; it is 0 or more"),
    ("micro_batch", "0", "column micro_batch: 0 is not allowed; it is at least 1"),
    ("checkpoint_level", "L9", "column checkpoint_level: 'L9' is not a level"),
    ("trial_id", "tb000_mb2_none_ga1_b0.1", "trial id 'tb000_mb2_none_ga1_b0.1' is given twice"),
])
def test_values_no_trial_can_have_are_refused(tmp_path, column, value, said):
    out = results(tmp_path)
    rows = read_csv_rows(out / "results.csv")
    rows[0][column] = value
    rewrite_csv(out / "results.csv", rows, list(rows[0]))
    for command in (["report", str(out)], ["recommend", str(out), "--memory-budget-gb", "40"]):
        proc = dpo(*command)
        assert proc.returncode == 2 and said in proc.stderr and "  line " in proc.stderr, proc.stderr[-2000:]


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 4 MiB (root only; skipped elsewhere), unmounted after the test."""
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave_bytes: int = 0) -> None:
    """Fill the file system, leaving about ``leave_bytes`` free."""
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with (mount / "filler").open("wb") as fh:
        try:
            fh.write(b"\0" * max(free - leave_bytes, 0))
        except OSError:
            pass


def test_a_full_disk_during_the_analysis_exits_1_and_leaves_no_cut_file(small_fs, tmp_path):
    out = results(small_fs, "r")
    assert dpo("report", str(out), "--memory-budget-gb", "40").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    fill(small_fs, leave_bytes=4096)  # report.html, the largest file, cannot be written again
    proc = dpo("report", str(out), "--memory-budget-gb", "40")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "report.html: the disk is full" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # Every file there is whole (the one report.html as before), no partial file left.
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_full_disk_at_the_start_of_a_sweep_is_one_line(small_fs, tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text("name: s\nmodel: {preset: tiny-llama}\ndata: {synthetic: {pairs: 8}}\n"
                     "train: {steps: 2, warmup_steps: 1}\nresources: {use_gpu: false}\n")
    fill(small_fs)
    proc = dpo("run", str(space), "--output", str(small_fs / "out"), "--no-dashboard")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the disk is full" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_an_append_on_a_full_disk_leaves_no_cut_line(small_fs):
    out = small_fs / "r"
    write_steps(out, steps_for("ta", 2, 5.0))
    before = (out / "steps.csv").read_bytes()
    fill(small_fs, leave_bytes=0)
    with pytest.raises(OSError):
        write_steps(out, [StepRecord("tb" + "x" * 200, s, 0.5, 1.0, 100.0, 5.0, 0.5, 0.1, -10.0, -11.0, 0.0)
                          for s in range(200)], append=True)
    assert (out / "steps.csv").read_bytes() == before


def test_a_read_only_folder_is_one_line(small_fs, tmp_path):
    out = results(small_fs, "r")
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    proc = dpo("report", str(out), "--memory-budget-gb", "40")
    assert proc.returncode == 1 and "read-only" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
