"""The results folder's file names are spelled once, in dpo_sweep/results_dir.py: every reader and
writer asks ResultsDir. The check reads the package's string literals with ast (docstrings and
comments may name the files: they explain, they do not build a path)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from dpo_sweep.results_dir import ResultsDir

PACKAGE = Path(__file__).resolve().parents[1] / "dpo_sweep"
HOME = PACKAGE / "results_dir.py"
#: The contract's names (docs/contracts.md#the-results-folder), written out here on purpose: the test
#: checks that ResultsDir keeps them.
NAMES = {"RESULTS": "results.csv", "STEPS": "steps.csv", "SPACE": "space.yaml", "DATA": "data.json",
         "ENVIRONMENT": "environment.json", "LOGS": "logs", "FRONTIER": "frontier.md",
         "RECOMMENDATION": "recommendation.json", "RECOMMENDED": "recommended.yaml", "REPORT": "report.html",
         "LOCK": ".sweep.lock", "PREVIOUS": "previous-"}
#: A name inside a literal, not part of a longer word or file name (report.html.j2 is a template).
PATTERNS = [re.compile(rf"(?<![\w-]){re.escape(n)}(?![\w.])" if n != "logs" else r"(?<![\w.-])logs(?=/|$)")
            for n in NAMES.values()] + [re.compile(r"\.log\b"), re.compile(r"\.rank\b")]


def code_strings(source: str) -> list[tuple[int, str]]:
    """Every string literal of ``source`` (f-string parts included) that is not a docstring or
    another bare string statement, with its line."""
    tree = ast.parse(source)
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare]


def spelled_names(source: str) -> list[tuple[int, str]]:
    return [(line, text) for line, text in code_strings(source) if any(p.search(text) for p in PATTERNS)]


def test_the_check_sees_literals_and_f_strings_but_not_docs():
    src = ('"""Reads results.csv."""\n'
           'def f(out):\n    """Writes steps.csv."""\n    # frontier.md\n'
           '    return out / "results.csv", f"{out}/logs/{1}.log", "report.html.j2"\n')
    assert [text for _, text in spelled_names(src)] == ["results.csv", "/logs/", ".log"]


def test_results_dir_keeps_the_contract_names(tmp_path):
    assert {k: getattr(ResultsDir, k) for k in NAMES} == NAMES
    d = ResultsDir(tmp_path)
    assert (d.results, d.steps, d.lock) == (tmp_path / "results.csv", tmp_path / "steps.csv", tmp_path / ".sweep.lock")
    assert d.worker_log("t000", 0) == tmp_path / "logs" / "t000.log"
    assert d.worker_log("t000", 2).name == "t000.rank2.log"
    assert d.previous("20260101-000000").name == "previous-20260101-000000"


def test_no_module_but_results_dir_spells_a_results_file_name():
    found = {str(p.relative_to(PACKAGE)): spelled_names(p.read_text())
             for p in sorted(PACKAGE.rglob("*.py")) if p != HOME}
    assert {k: v for k, v in found.items() if v} == {}


def template_text(source: str) -> str:
    """A Jinja template's own text: its ``{{ ... }}``, ``{% ... %}`` and ``{# ... #}`` left out."""
    return re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", source, flags=re.S)


def test_the_report_template_names_the_files_through_results_dir():
    assert template_text("<p>{{ files.RESULTS }} or results.csv</p>") == "<p>  or results.csv</p>"
    found = {p.name: [pat.pattern for pat in PATTERNS if pat.search(template_text(p.read_text()))]
             for p in sorted(PACKAGE.rglob("*.j2"))}
    assert found and {k: v for k, v in found.items() if v} == {}
