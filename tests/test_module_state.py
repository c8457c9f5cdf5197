"""No module keeps process state that its functions change: a module-level name is a constant.
What a process carries from one trial to the next is an object its owner passes in (the warm
worker's train/warm_state.WarmState). Read from the source with ast."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpo_sweep"
MUTATORS = {"update", "clear", "append", "extend", "add", "pop", "setdefault", "insert", "remove", "discard",
            "popitem"}
#: The one exemption: liger-kernel patches modelling modules of the whole process, so the record of
#: what it replaced (to put it back after the trial) is the process's too.
EXEMPT = {("train/model.py", "_UNPATCHED")}


def changed_module_names(source: str) -> set[str]:
    """The module-level names that a function of ``source`` changes: ``global``, a mutating method,
    an item or attribute assigned or deleted."""
    tree = ast.parse(source)
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    found: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found.update(node.names)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.attr in MUTATORS):
                found.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
                found.update(t.value.id for t in targets
                             if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name))
    return found & names


def test_the_check_sees_each_kind_of_change():
    src = ("A = {}\nB = []\nC = {}\nD = 0\nE = {}\nF = (1,)\n"
           "def f(x):\n    A.update(x)\n    B.append(x)\n    C[x] = 1\n    global D\n    D = x\n"
           "    local = {}\n    local[x] = F\n")
    assert changed_module_names(src) == {"A", "B", "C", "D"}


def test_no_module_level_state_is_changed_by_its_functions():
    # plan/memory.py takes the models' shapes as an argument; train/setup.py keeps nothing between trials.
    found = {(str(p.relative_to(PACKAGE)), name) for p in sorted(PACKAGE.rglob("*.py"))
             for name in changed_module_names(p.read_text())}
    assert found - EXEMPT == set()


def test_the_exemption_is_still_needed():
    # An exemption for a name that went away would silently exempt the next one of that name.
    for path, name in EXEMPT:
        assert name in changed_module_names((PACKAGE / path).read_text())
