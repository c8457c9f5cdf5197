"""benchmarks/validate_scale.py: spaces of exactly the sizes asked, validated in their own processes."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import validate_scale  # noqa: E402


def test_a_space_has_the_size_asked_and_an_odd_size_is_refused():
    for size in (250, 1000, 12500, 100000):
        search = validate_scale.space(size)["search"]
        n = 1
        for values in search.values():
            n *= len(values)
        assert n == size
    with pytest.raises(SystemExit):
        validate_scale.space(300)


def test_smoke_validates_and_writes_the_table(tmp_path):
    rows = validate_scale.run([250], 1, tmp_path)
    with (tmp_path / "results.csv").open() as fh:
        written = list(csv.DictReader(fh))
    assert [int(r["configurations"]) for r in written] == [250] and rows[0]["median_wall_s"] > 0
    # the table: a header and one row per configuration, after the summary and data lines
    assert int(written[0]["stdout_lines"]) >= 251 and float(written[0]["peak_rss_gb"]) > 0.05
