"""benchmarks/results/<benchmark>/<label>/: every committed run in a folder named for what it
measured, with a README.md of provenance; no loose files, no folder named after a commit."""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
#: Folders another engineer writes to in their own layout (an issue names their path).
OWN_LAYOUT = {"extrapolation_h200", "user_case_h200"}
COMMIT_ID = re.compile(r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}")


def test_every_label_has_a_readme_and_nothing_is_loose():
    benchmarks = [d for d in sorted(RESULTS.iterdir()) if d.name not in OWN_LAYOUT]
    assert not [d.name for d in benchmarks if not d.is_dir()], "loose files in benchmarks/results/"
    labels = [label for b in benchmarks for label in sorted(b.iterdir()) if label.is_dir()]
    assert labels
    assert [str(lb.relative_to(RESULTS)) for lb in labels if not (lb / "README.md").is_file()] == []
    loose = [str(f.relative_to(RESULTS)) for b in benchmarks for f in b.iterdir() if f.is_file() and f.name != "README.md"]
    assert loose == []


def test_no_folder_is_named_after_a_commit():
    named = [str(d.relative_to(RESULTS)) for d in RESULTS.rglob("*") if d.is_dir() and COMMIT_ID.search(d.name)
             and d.relative_to(RESULTS).parts[0] not in OWN_LAYOUT]
    assert named == []
