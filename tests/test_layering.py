"""Producers never import consumers: nothing under train/, sweep/ or telemetry/ (nor the neutral
records module) imports dpo_sweep.analysis or dpo_sweep.report, read from the source with ast."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpo_sweep"
PRODUCERS = ("train", "sweep", "telemetry")
CONSUMERS = ("dpo_sweep.analysis", "dpo_sweep.report")
#: `dpo-sweep run` ends by analysing the directory it wrote, as `dpo-sweep report` would: that is a
#: CLI command calling the consumer on purpose, so its file (and only it) may import the analyser.
EXEMPT = {PACKAGE / "sweep" / "command.py"}


def imported_modules(source: str) -> list[str]:
    """Every module an import statement anywhere in ``source`` names (function-level included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def consumer_imports(path: Path) -> list[str]:
    return [m for m in imported_modules(path.read_text())
            if any(m == c or m.startswith(c + ".") for c in CONSUMERS)]


def _producer_files() -> list[Path]:
    files = [p for d in PRODUCERS for p in sorted((PACKAGE / d).rglob("*.py"))]
    return files + [PACKAGE / "records.py", PACKAGE / "config.py", PACKAGE / "space.py"]


def test_the_check_sees_both_kinds_of_import():
    src = "import dpo_sweep.report.html\ndef f():\n    from dpo_sweep.analysis import results\n"
    assert imported_modules(src) == ["dpo_sweep.report.html", "dpo_sweep.analysis",
                                     "dpo_sweep.analysis.results"]


def test_producers_do_not_import_consumers():
    found = {str(p.relative_to(PACKAGE)): consumer_imports(p)
             for p in _producer_files() if p not in EXEMPT}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_exempt_file_exists():
    # An exemption for a file that was renamed away would silently exempt nothing.
    assert all(p.is_file() for p in EXEMPT)
