"""The arrows between the package's layers, read from the source with ast:
- producers never import consumers: nothing under train/, sweep/, telemetry/ or plan/ (nor the
  neutral records, config and space modules) imports dpo_sweep.analysis or dpo_sweep.report;
- the analysis never imports the report (the report renders what the analysis computed);
- the commands (dpo_sweep/commands/) are the top layer: they may import anything, and nothing in
  the package imports them but the command line (cli.py, __main__.py);
- the producers never import the preflight (the commands run it before any work), but for the one
  module that runs it in a process of its own beside Ray's start (sweep/startup.py).;
- the planner (plan/) imports neither the trainer (train/) nor the telemetry; what a model is
  (models/) imports only the neutral core, and the neutral core (core/) imports no other layer."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpo_sweep"
PRODUCERS = ("train", "sweep", "telemetry", "plan", "models")
CONSUMERS = ("dpo_sweep.analysis", "dpo_sweep.report")
COMMANDS = "dpo_sweep.commands"
PREFLIGHT = "dpo_sweep.preflight"
#: `dpo-sweep run`'s start-up: the preflight in a process of its own while Ray and the warm workers
#: start (sweep/startup.py's BackgroundPreflight), the one producer-side module that runs it.
PREFLIGHT_RUNNERS = {PACKAGE / "sweep" / "startup.py"}
#: The command line, which parses the arguments and calls the commands.
COMMAND_LINE = {PACKAGE / "cli.py", PACKAGE / "__main__.py"}


def imported_modules(source: str) -> list[str]:
    """Every module an import statement anywhere in ``source`` names (function-level included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def imports_of_source(source: str, modules: tuple[str, ...]) -> list[str]:
    """The imports in ``source`` of ``modules`` or any module under them."""
    return [m for m in imported_modules(source) if any(m == c or m.startswith(c + ".") for c in modules)]


def imports_of(path: Path, modules: tuple[str, ...]) -> list[str]:
    return imports_of_source(path.read_text(), modules)


def _producer_files() -> list[Path]:
    files = [p for d in PRODUCERS for p in sorted((PACKAGE / d).rglob("*.py"))]
    return files + [PACKAGE / "records.py", PACKAGE / "config.py", PACKAGE / "space.py"]


def test_the_check_sees_both_kinds_of_import():
    src = "import dpo_sweep.report.html\ndef f():\n    from dpo_sweep.analysis import results\n"
    assert imported_modules(src) == ["dpo_sweep.report.html", "dpo_sweep.analysis",
                                     "dpo_sweep.analysis.results"]


def test_the_check_sees_the_commands_and_the_preflight():
    src = "from dpo_sweep import preflight\ndef f():\n    from dpo_sweep.commands.report import analyse_dir\n"
    assert imports_of_source(src, (PREFLIGHT,)) == ["dpo_sweep.preflight"]
    assert imports_of_source(src, (COMMANDS,)) == ["dpo_sweep.commands.report", "dpo_sweep.commands.report.analyse_dir"]
    assert imports_of_source("import dpo_sweep.commands_of_old\n", (COMMANDS,)) == []


def _found(files: list[Path], modules: tuple[str, ...]) -> dict[str, list[str]]:
    found = {str(p.relative_to(PACKAGE)): imports_of(p, modules) for p in files}
    return {k: v for k, v in found.items() if v}


def test_producers_do_not_import_consumers():
    assert _found(_producer_files(), CONSUMERS) == {}


def test_the_analysis_does_not_import_the_report():
    assert _found(sorted((PACKAGE / "analysis").rglob("*.py")), ("dpo_sweep.report",)) == {}


def test_nothing_but_the_command_line_imports_a_command():
    outside = [p for p in sorted(PACKAGE.rglob("*.py"))
               if p not in COMMAND_LINE and (PACKAGE / "commands") not in p.parents]
    assert _found(outside, (COMMANDS,)) == {}
    # ... and the command line reaches every module of commands/ (none is left without a caller).
    reached = {m for p in COMMAND_LINE for m in imports_of(p, (COMMANDS,))}
    assert {f"{COMMANDS}.{p.stem}" for p in (PACKAGE / "commands").glob("*.py") if p.stem != "__init__"} <= reached


def test_producers_do_not_import_the_preflight():
    files = [p for d in PRODUCERS for p in sorted((PACKAGE / d).rglob("*.py")) if p not in PREFLIGHT_RUNNERS]
    assert _found(files, (PREFLIGHT,)) == {}


def test_the_exempt_files_exist():
    # An exemption for a file that was renamed away would silently exempt nothing.
    assert all(p.is_file() for p in PREFLIGHT_RUNNERS | COMMAND_LINE)


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
def _layers(*names: str) -> tuple[str, ...]:
    return tuple(f"dpo_sweep.{name}" for name in names)


def test_the_layers_are_the_sub_packages():
    assert {"core", "models", "plan", "train", "telemetry", "analysis", "report", "sweep", "commands"} <= set(LAYERS)


def test_plan_imports_neither_train_nor_telemetry():
    # A model's shape comes from models/ (what the trainer reads of a family too), not from train/.
    found = {str(p.relative_to(PACKAGE)): imports_of(p, _layers("train", "telemetry"))
             for p in sorted((PACKAGE / "plan").rglob("*.py"))}
    assert found and {k: v for k, v in found.items() if v} == {}


def test_models_import_only_the_core():
    others = _layers(*(layer for layer in LAYERS if layer not in ("core", "models")))
    found = {str(p.relative_to(PACKAGE)): imports_of(p, others) for p in sorted((PACKAGE / "models").rglob("*.py"))}
    assert found and {k: v for k, v in found.items() if v} == {}


def test_core_imports_no_other_layer():
    others = _layers(*(layer for layer in LAYERS if layer != "core"))
    found = {str(p.relative_to(PACKAGE)): imports_of(p, others) for p in sorted((PACKAGE / "core").rglob("*.py"))}
    assert found and {k: v for k, v in found.items() if v} == {}
