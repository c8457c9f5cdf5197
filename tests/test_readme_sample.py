"""The README's quickstart sample (the frontier table's first rows, the recommended line) and its
annotated screenshot match a quickstart run: the run's results.csv is committed
(docs/images/quickstart-results.csv), and the README must be what today's analysis writes from
it, for a results file whose configurations are today's quickstart space. No sweep runs here.
When this fails, refresh them (about a minute on a CPU):

    dpo-sweep run search_spaces/quickstart.yaml --output /tmp/qs
    python docs/annotate_report.py --refresh /tmp/qs
"""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.analysis.completeness import completeness
from dpo_sweep.analysis.results import load_results
from dpo_sweep.space import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import annotate_report  # noqa: E402

REFRESH = "run `python docs/annotate_report.py --refresh DIR` on a fresh quickstart run (see this test's doc)"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    run = tmp_path_factory.mktemp("qs")
    shutil.copyfile(annotate_report.RESULTS, run / "results.csv")
    shutil.copyfile(ROOT / "search_spaces" / "quickstart.yaml", run / "space.yaml")
    return run, analyse_dir(run)


def test_the_committed_results_are_todays_quickstart_space(analysed):
    run, _ = analysed
    rows = load_results(run)
    assert len(rows) == len(load(ROOT / "search_spaces" / "quickstart.yaml").trials), REFRESH
    state = completeness(run, rows)
    assert state.complete is True, f"{state.still_to_run}: {REFRESH}"


def test_the_readme_sample_is_what_the_analysis_writes(analysed):
    _, outcome = analysed
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert annotate_report.readme_sample(readme) == annotate_report.sample_block(outcome.frontier_markdown), REFRESH
    head = outcome.recommendation_text.splitlines()[0]
    assert f"(`{head}`" in readme, REFRESH


def test_the_screenshot_was_taken_of_this_results_file_and_its_badges_exist(analysed):
    _, outcome = analysed
    stamp = json.loads(annotate_report.STAMP.read_text())
    assert stamp["results_sha256"] == hashlib.sha256(annotate_report.RESULTS.read_bytes()).hexdigest(), REFRESH
    png = annotate_report.SCREENSHOT.read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (width, height) == tuple(stamp["window"]), REFRESH
    page = outcome.report_path.read_text(encoding="utf-8")
    for selector, _ in annotate_report.BADGES:
        assert f'id="{selector[1:]}"' in page, selector
