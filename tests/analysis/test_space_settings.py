"""The analysis takes the sweep's settings from the space as config.py validates it: the run's own
parsed space, or DIR/space.yaml's resources and objectives sections, never hand-checked YAML."""
from __future__ import annotations

import json
from pathlib import Path

from sweep_frames import sweep_trials, trial, write_dir

from dpo_sweep import space
from dpo_sweep.cli import _parser, main

QUICKSTART = Path(__file__).resolve().parents[2] / "search_spaces" / "quickstart.yaml"


def test_a_bad_emulated_card_in_space_yaml_is_refused_with_the_field(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", [trial("a", 10.0, 200.0, 0.02)])
    (out_dir / "space.yaml").write_text("name: x\nresources: {gpu_memory_gb: -12}\n")
    assert main(["report", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "resources.gpu_memory_gb" in err and "-12" in err and str(out_dir / "space.yaml") in err


def test_an_unknown_objective_in_space_yaml_is_refused_with_the_field(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", [trial("a", 10.0, 200.0, 0.02)])
    (out_dir / "space.yaml").write_text("name: x\nobjectives: {memroy: min}\n")
    assert main(["recommend", str(out_dir), "--memory-budget-gb", "20"]) == 2
    assert "objectives.memroy" in capsys.readouterr().err


def test_the_end_of_a_run_uses_the_space_it_parsed(tmp_path):
    """`dpo-sweep run` hands its validated space to the analysis: what DIR/space.yaml says
    afterwards (here: nothing, the file is gone) does not matter."""
    from dpo_sweep.commands import run as command

    out_dir = write_dir(tmp_path / "r", sweep_trials())
    raw = space.load_raw(QUICKSTART)
    raw["objectives"] = {"memory": "min"}
    raw["resources"] = {**raw.get("resources", {}), "gpu_memory_gb": 18}
    spec = space.parse(raw).spec
    args = _parser().parse_args(["run", "x.yaml"])
    command._analyse(out_dir, args, lambda _line: None, spec)
    assert "Objectives: memory min." in (out_dir / "frontier.md").read_text()
    rec = json.loads((out_dir / "recommendation.json").read_text())
    assert rec["memory_budget_gb"] == 18.0 and rec["budget_source"].startswith("space.yaml")
