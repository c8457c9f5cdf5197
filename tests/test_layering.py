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


#: The layers of the package: its sub-packages (top-level modules such as config.py, errors.py and
#: records.py are the package's own ground, which every layer may import).
LAYERS = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
#: plan/shape.py reads a model's shape from its meta-device build, through the trainer's own reading
#: of a family's modules (train/family.py: torch and transformers, imported inside ``built_shape``
#: only), so the planner sizes exactly the modules the trainer wraps; a driver given the shapes by
#: the preflight never runs it.
PLAN_EXEMPT = {("plan/shape.py", "dpo_sweep.train.family")}


def layer_imports(path: Path, layers: tuple[str, ...]) -> list[str]:
    """The modules of ``layers`` (``train``, ...) that ``path`` imports, function-level included."""
    return sorted({m for m in imported_modules(path.read_text())
                   if any(m == f"dpo_sweep.{layer}" or m.startswith(f"dpo_sweep.{layer}.") for layer in layers)})


def test_the_layers_are_the_sub_packages():
    assert {"core", "plan", "train", "telemetry", "analysis", "report", "sweep"} <= set(LAYERS)


def test_plan_imports_neither_train_nor_telemetry():
    found = {(str(p.relative_to(PACKAGE)), m) for p in sorted((PACKAGE / "plan").rglob("*.py"))
             for m in layer_imports(p, ("train", "telemetry"))}
    found = {(f, m.rsplit(".", 1)[0] if m.count(".") > 2 else m) for f, m in found}
    assert found - PLAN_EXEMPT == set()
    assert PLAN_EXEMPT <= found  # an exemption that no longer applies is taken out


def test_core_imports_no_other_layer():
    others = tuple(layer for layer in LAYERS if layer != "core")
    found = {str(p.relative_to(PACKAGE)): layer_imports(p, others) for p in sorted((PACKAGE / "core").rglob("*.py"))}
    assert found and {k: v for k, v in found.items() if v} == {}


def test_the_layer_check_sees_a_layer_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from dpo_sweep import config\ndef f():\n    from dpo_sweep.telemetry.sampler import x\n")
    assert layer_imports(src, ("train", "telemetry")) == ["dpo_sweep.telemetry.sampler",
                                                          "dpo_sweep.telemetry.sampler.x"]
    assert layer_imports(src, ("train",)) == []
