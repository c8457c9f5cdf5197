"""Producers never import consumers: nothing under train/, sweep/ or telemetry/ (nor the neutral
records module) imports dpo_sweep.analysis or dpo_sweep.report, read from the source with ast."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpo_sweep"
PRODUCERS = ("train", "sweep", "telemetry")
CONSUMERS = ("dpo_sweep.analysis", "dpo_sweep.report")


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
    found = {str(p.relative_to(PACKAGE)): consumer_imports(p) for p in _producer_files()}
    assert {k: v for k, v in found.items() if v} == {}


def _import_graph() -> dict[str, set[str]]:
    """Each dpo_sweep module -> the dpo_sweep modules it imports (function-level imports included)."""
    files = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for module in imported_modules(path.read_text()):
            while module and module not in files:  # `from pkg.mod import name` names pkg.mod.name
                module = module.rpartition(".")[0]
            if module and module not in (name, "dpo_sweep"):
                deps.add(module)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each a path that leads back to its first module."""
    found: list[list[str]] = []
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            walk(dep, path + [node])
        done.add(node)

    for node in sorted(graph):
        walk(node, [])
    return found


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_imports_one_that_imports_it_back():
    # The trial's two paths (sweep/trainable.py: Ray Train; sweep/warm_worker.py) share
    # sweep/trial_run.py and sweep/protocol.py; the warm worker never imports the trainable.
    graph = _import_graph()
    assert "dpo_sweep.sweep.trainable" not in graph["dpo_sweep.sweep.warm_worker"]
    assert _cycles(graph) == []
