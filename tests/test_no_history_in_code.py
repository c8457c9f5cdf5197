"""Code says why in the present: no comment or docstring names an issue or a commit (that history
lives in git and in benchmarks/results/<benchmark>/<label>/README.md)."""
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
