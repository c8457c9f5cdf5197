"""The committed example reports (reports/examples/*/) are what today's `dpo-sweep report` writes
from their results: regenerated from a copy of their inputs, every output matches byte for byte
(the outputs hold no timestamp), and every report.html is at most 1.5 MB.

The TRL export in them uses the TRL field list recorded with the package (the same wherever the
test runs, TRL installed or not). When this fails after a change to the analysis or the report,
regenerate them:
    python -c "import glob; from dpo_sweep import trl_fields; from dpo_sweep.commands.report import
    analyse_dir; [analyse_dir(d, trl=trl_fields.from_recorded()) for d in glob.glob('reports/examples/*/')]"
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpo_sweep import trl_fields
from dpo_sweep.commands.report import analyse_dir

EXAMPLES = Path(__file__).resolve().parents[2] / "reports" / "examples"
INPUTS = ("results.csv", "steps.csv", "space.yaml", "environment.json", "data.json")
OUTPUTS = ("frontier.md", "recommendation.json", "report.html", "recommended.yaml")
MAX_REPORT_BYTES = 1_500_000


@pytest.mark.parametrize("example", sorted(p for p in EXAMPLES.iterdir() if (p / "results.csv").is_file()),
                         ids=lambda p: p.name)
def test_example_report_is_current(example, tmp_path):
    copy = tmp_path / example.name
    copy.mkdir()
    for name in INPUTS:
        if (example / name).is_file():
            shutil.copyfile(example / name, copy / name)
    analyse_dir(copy, trl=trl_fields.from_recorded())
    here = str(example.relative_to(EXAMPLES.parents[1]))  # the path the committed files name
    for name in OUTPUTS:
        written, committed = copy / name, example / name
        assert written.is_file() == committed.is_file(), f"{name}: regenerate {here}"
        if written.is_file():
            assert written.read_text().replace(str(copy), here) == committed.read_text(), \
                f"{here}/{name} is stale: regenerate it with `dpo-sweep report {here}`"
    assert (example / "report.html").stat().st_size <= MAX_REPORT_BYTES


def test_there_are_examples():
    assert len([p for p in EXAMPLES.iterdir() if (p / "results.csv").is_file()]) >= 9
