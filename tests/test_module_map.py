"""docs/design.md's code layout names every module under dpo_sweep/, each in its own folder's entry."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpo_sweep"
DESIGN = ROOT / "docs" / "design.md"


def map_entries(text: str) -> dict[str, str]:
    """The package's entries in the layout block: ``train/`` (or ``cli.py``) -> the entry's text,
    its continuation lines (indented deeper) included."""
    block = text.split("```\ndpo_sweep/\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        if re.match(r"^  \S", line):
            name, _, rest = line.strip().partition(" ")
            entries[name] = rest.strip()
        elif re.match(r"^   ", line) and name is not None:
            entries[name] += " " + line.strip()
        else:
            name = None  # a line at the left margin (benchmarks/, ...) is outside the package
    return entries


def test_the_parser_reads_entries_and_their_continuations():
    text = "```\ndpo_sweep/\n  cli.py   x\n  train/   a.py,\n           b.py\nbenchmarks/  c.py\n```"
    assert map_entries(text) == {"cli.py": "x", "train/": "a.py, b.py"}


def test_every_module_is_in_the_module_map():
    entries = map_entries(DESIGN.read_text())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:
            found = rel.name in entries
        else:
            found = re.search(rf"(?<![\w.]){re.escape(rel.name)}\b", entries.get(f"{rel.parts[0]}/", "")) is not None
        if not found:
            missing.append(str(rel))
    assert not missing, f"modules missing from docs/design.md's code layout: {missing}"


def test_every_module_the_map_names_exists():
    """The other direction: a module named in a folder's entry (``train/``: ``loop.py``) is in that
    folder, or in the folder a path names it under (``sweep/startup.py``), and each top-level
    entry is a module of the package."""
    entries = map_entries(DESIGN.read_text())
    gone = []
    for name, text in entries.items():
        if not name.endswith("/"):
            gone += [] if (PACKAGE / name).is_file() else [name]
            continue
        for path in re.findall(r"(?<![\w.])((?:\w+/)*\w+\.py)\b", text):
            here = PACKAGE / name / path
            if not (here.is_file() or (PACKAGE / path).is_file() or any((PACKAGE / name).rglob(path))):
                gone.append(f"{name}{path}")
    assert not gone, f"docs/design.md's code layout names modules that are not there: {gone}"
