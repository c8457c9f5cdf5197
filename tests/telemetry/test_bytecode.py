"""Whether the imports had bytecode (dpo_sweep/telemetry/bytecode.py): modules compiled from source
with none left behind are counted per package, and a large count becomes the console's note with
the command that compiles them once."""
from __future__ import annotations

import compileall
import importlib
import sys
from pathlib import Path

import pytest

from dpo_sweep.telemetry.bytecode import bytecode_note, uncached_imports


def _package(root: Path, name: str, modules: int) -> Path:
    home = root / name
    home.mkdir()
    (home / "__init__.py").write_text("")
    for i in range(modules):
        (home / f"m{i}.py").write_text(f"VALUE = {i}\n")
    return home


def _import(name: str, modules: int) -> dict:
    imported = {name: importlib.import_module(name)}
    for i in range(modules):
        imported[f"{name}.m{i}"] = importlib.import_module(f"{name}.m{i}")
    return imported


@pytest.fixture
def packages(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.partition(".")[0] in ("nobytecode", "compiled")]:
        del sys.modules[name]


def test_modules_compiled_from_source_without_bytecode_are_counted_per_package(packages, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1
    bare = _package(packages, "nobytecode", 3)
    compiled = _package(packages, "compiled", 2)
    assert compileall.compile_dir(str(compiled), quiet=1)  # what `python -m compileall` leaves
    modules = {**_import("nobytecode", 3), **_import("compiled", 2)}
    assert uncached_imports(modules) == {"nobytecode": (4, bare)}  # the package and its 3 modules
    assert not list(bare.rglob("*.pyc"))


def test_bytecode_python_wrote_at_import_is_not_counted(packages, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    _package(packages, "nobytecode", 2)
    assert uncached_imports(_import("nobytecode", 2)) == {}


def test_built_in_and_extension_modules_are_not_counted():
    import math

    assert uncached_imports({"sys": sys, "math": math}) == {}


def test_the_note_names_the_large_packages_why_and_the_command():
    found = {"sympy": (400, Path("/site/sympy")), "torch": (3000, Path("/site/torch")),
             "mine": (12, Path("/work/mine"))}
    note = bytecode_note(found, dont_write=True)
    assert note.startswith("note: 3,400 modules of torch and sympy have no bytecode")
    assert "PYTHONDONTWRITEBYTECODE=1" in note
    assert note.endswith("python -m compileall -q -j 0 /site/torch /site/sympy")  # largest first
    assert "mine" not in note  # below MIN_UNCACHED: a checkout's own modules are noise


def test_the_note_for_an_install_python_cannot_write_to():
    note = bytecode_note({"torch": (3000, Path("/site/torch"))}, dont_write=False)
    assert "not writable" in note and "PYTHONPYCACHEPREFIX" in note
    assert "python -m compileall -q -j 0 /site/torch" in note


def test_no_note_without_a_large_package():
    assert bytecode_note({}) is None
    assert bytecode_note({"torch": (99, Path("/site/torch"))}) is None
    assert bytecode_note({"torch": (100, Path("/site/torch"))}, dont_write=True) is not None
