"""docs/design.md's "How a trial flows" names real code: every dotted path in backticks there
imports (a module, or a module's attribute: a function, a class, a method)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def flow_section(text: str) -> str:
    start = text.index("\n## How a trial flows\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def dotted_paths(text: str) -> list[str]:
    """The ``dpo_sweep.…`` names in backticks, in the order the section names them (once each)."""
    return list(dict.fromkeys(re.findall(r"`(dpo_sweep(?:\.\w+)+)`", flow_section(text))))


def resolve(path: str) -> object:
    """The object a dotted path names: the longest prefix that imports as a module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:cut]).startswith(err.name):
                raise  # a module that exists but fails to import: that is the failure to show
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)  # not even the package imports


def test_the_reader_finds_paths_and_resolve_refuses_a_missing_one():
    text = "\n## How a trial flows\n1. `dpo_sweep.records.write_results` and `dpo_sweep.records`.\n## Tests\n`dpo_sweep.x`"
    assert dotted_paths(text) == ["dpo_sweep.records.write_results", "dpo_sweep.records"]
    from dpo_sweep.records import write_results

    assert resolve("dpo_sweep.records.write_results") is write_results
    for missing in ("dpo_sweep.records.no_such_writer", "dpo_sweep.no_such_module.run"):
        with pytest.raises(AttributeError):
            resolve(missing)


def test_the_flow_runs_from_the_command_line_to_the_report():
    paths = dotted_paths(DESIGN.read_text())
    ends = ["dpo_sweep.cli.main", "dpo_sweep.space.load", "dpo_sweep.train.loop.run_trial",
            "dpo_sweep.records.write_results", "dpo_sweep.report.html.write_report"]
    assert [p for p in paths if p in ends] == ends  # named, and in this order


@pytest.mark.parametrize("path", dotted_paths(DESIGN.read_text()))
def test_every_name_in_the_flow_resolves(path):
    assert resolve(path) is not None
