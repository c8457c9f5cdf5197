"""Code says why in the present: no comment or docstring names an issue or a commit, and none in the
package tells a machine's story (a GPU model, a core count); that history lives in git, and the
measurements in benchmarks/README.md and benchmarks/results/<benchmark>/<label>/README.md."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The code: the package, the benchmark scripts (not their committed results) and the tests.
CODE = ([*sorted((ROOT / "dpo_sweep").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
        + [p for p in sorted((ROOT / "benchmarks").rglob("*.py")) if "results" not in p.relative_to(ROOT).parts])
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.sh"))
HISTORY = re.compile(r"\bissues? #?\d+|(?<![\w&])#\d+\b"  # an issue number, after "issue" or "#"
                     r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b",  # a commit id
                     re.IGNORECASE)


#: A machine named in prose: a GPU model or a core count. Paths are left out before matching (a
#: committed run's folder, ``reports/examples/...-h200/``, is a name, not a story).
MACHINE = re.compile(r"\b(?:G?H[12]00|H800|A[18]00|A10G|B[12]00|V100|RTX ?\d{4}|MI[23]\d0X?)\b"
                     r"|\b(?:\d+|one|two|four|eight|sixteen)[- ]cores?\b(?! ones)|\bworkplace\b",
                     re.IGNORECASE)
PATH = re.compile(r"\S*/\S*")
#: Where a card's name is data, not a story: the card catalog and the peak-rate table by device name.
MACHINE_NAMES_ARE_DATA = {"dpo_sweep/cards.py", "dpo_sweep/core/flops.py"}


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of Python ``source``."""
    found = [(tok.start[0], tok.string.lstrip("#")) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def history_in(text: str) -> list[str]:
    return [m.group(0) for m in HISTORY.finditer(text)]


def test_the_check_sees_issues_and_commits_but_not_numbers():
    source = '"""Fixed in 551afb2."""\nx = 1  # see issue 14 and #12\ny = 2250e12  # 7.4 s, 1e9 bytes, 0.3 GB\n'
    assert sorted(h for _, text in prose(source) for h in history_in(text)) == ["#12", "551afb2", "issue 14"]
    # Hex colours and numbers in code are not prose.
    assert prose('c = "#fbeaea"\n') == []


def machines_in(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE.finditer(PATH.sub(" ", text))]


def test_the_check_sees_machines_but_not_paths_or_levels():
    source = ('"""Took 1.3 s on the 2-core machine."""\n'
              "# on the H200 ~23 s; see reports/examples/llama-h200/ and benchmarks/results/user_case_h200/\n"
              "x = 1  # L4 is refused; the four core ones; two cores; 8-core hosts; an A100-80GB\n")
    found = sorted(h for _, text in prose(source) for h in machines_in(text))
    assert found == ["2-core", "8-core", "A100", "H200", "two cores"]


def test_no_comment_in_the_package_tells_a_machine_s_story():
    """Measurements move to benchmarks/README.md (or a run's README); the comment keeps the why."""
    found = {}
    for path in sorted((ROOT / "dpo_sweep").rglob("*.py")):
        if str(path.relative_to(ROOT)) in MACHINE_NAMES_ARE_DATA:
            continue
        for line, text in prose(path.read_text()):
            if machines_in(text):
                found[f"{path.relative_to(ROOT)}:{line}"] = machines_in(text)
    assert found == {}


def test_no_comment_names_an_issue_or_a_commit():
    found = {}
    for path in CODE:
        for line, text in prose(path.read_text()):
            if history_in(text):
                found[f"{path.relative_to(ROOT)}:{line}"] = history_in(text)
    for path in SCRIPTS:
        for line, text in enumerate(path.read_text().splitlines(), 1):
            if text.lstrip().startswith("#") and history_in(text.lstrip().lstrip("#")):
                found[f"{path.relative_to(ROOT)}:{line}"] = history_in(text)
    assert found == {}
