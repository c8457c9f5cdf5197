"""`dpo-sweep compare DIR1 DIR2`: the same configurations matched by their settings (not their
ids), their memory and tokens/s in both runs, what only one has, and what changed between the runs."""
from __future__ import annotations

import json
from dataclasses import replace

from sweep_frames import trial, write_dir

from dpo_sweep.analysis.compare import compare
from dpo_sweep.cli import main


def folders(tmp_path):
    first = write_dir(tmp_path / "a", [trial("t000_mb1", 10.0, 100.0, 0.02, mb=1, seed=0),
                                       trial("t001_mb2", 12.0, 90.0, 0.02, mb=2, seed=0)],
                      env={"gpu": {"name": "H100"}, "collected_at_utc": "x"})
    # Another space: other ids for the same settings, one configuration more, another machine
    second = write_dir(tmp_path / "b", [replace(trial("t005_mb2", 12.6, 80.0, 0.02, mb=2, seed=0)),
                                        trial("t004_mb1", 10.0, 125.0, 0.02, mb=1, seed=0),
                                        trial("t006_mb4", status="oom", mb=4, seed=0)],
                       env={"gpu": {"name": "H200"}, "collected_at_utc": "y"})
    (first / "space.yaml").write_text("name: a\nsearch: {micro_batch: [1, 2]}\n")
    (second / "space.yaml").write_text("name: a\nsearch: {micro_batch: [1, 2, 4]}\n")
    (first / "recommendation.json").write_text(json.dumps({"trial_id": "t001_mb2", "config": {"micro_batch": 2}}))
    return first, second


def test_compare_matches_by_settings_and_says_what_changed(tmp_path):
    first, second = folders(tmp_path)
    c = compare(first, second)
    assert c.header[:3] == ("trial (1)", "trial (2)", "micro_batch")
    assert [r[:3] for r in c.rows] == [["t000", "t004", "1"], ["t001", "t005", "2"]]
    mem, tps = c.header.index("peak GB (2)"), c.header.index("tokens/s (2)")
    assert c.rows[1][mem:mem + 2] == ["12.60", "+5.0%"] and c.rows[0][tps:tps + 2] == ["8,000", "-20.0%"]
    assert c.only_first == [] and c.only_second == ["t006"]
    assert "recommendation: t001_mb2 (micro_batch 2) -> (none written)" in c.changes
    assert "space search.micro_batch: [1, 2] -> [1, 2, 4]" in c.changes
    assert "machine gpu.name: H100 -> H200" in c.changes
    assert not any("collected_at_utc" in line for line in c.changes)  # differs every run: no news


def test_compare_command_prints_and_refuses_a_folder_without_results(tmp_path, capsys):
    first, second = folders(tmp_path)
    assert main(["compare", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "2 configuration(s) in both" in out and "| t000 | t004 | 1 |" in out and "only in (2): t006" in out
    assert main(["compare", str(first), str(tmp_path / "nothing")]) == 2
    assert "nothing does not exist" in capsys.readouterr().err
