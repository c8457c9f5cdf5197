"""A space file that is no space file is refused in seconds with a short message, as `dpo-sweep
validate` and `run` see it in their own processes: a YAML alias bomb, a 50 MB file, a name that
leaves reports/ or carries control characters, a FIFO."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOOD = """model: {preset: tiny-llama}
data: {synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}
train: {steps: 2, warmup_steps: 1}
search: {micro_batch: [2]}
"""


def _limit_memory() -> None:
    limit = 3 * 1024 ** 3  # what one dpo-sweep process may use here; the bomb needed 11 GB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def dpo(*args: str, cwd: Path, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dpo_sweep", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc, time.monotonic() - start


def bomb(levels: int = 9) -> str:
    """The billion-laughs file: each alias a list of ten of the one before (10^10 values)."""
    lines = ["name: bomb", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\n{GOOD}model: *a{levels}\n"


def test_an_alias_bomb_is_refused_in_seconds(tmp_path):
    (tmp_path / "bomb.yaml").write_text(bomb())
    proc, seconds = dpo("validate", "bomb.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "aliases (*name) expand to more than 100,000 values" in proc.stderr and len(proc.stderr) < 1000
    assert seconds < 30 and "Traceback" not in proc.stderr


def test_a_50_mb_file_is_refused_without_reading_it_and_with_a_short_message(tmp_path):
    with (tmp_path / "big.yaml").open("w") as fh:
        fh.write("name: big\nnote: '" + "x" * 50_000_000 + "'\n" + GOOD)
    proc, seconds = dpo("validate", "big.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "a space file is a few kilobytes" in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr) < 1000 and seconds < 30


def test_a_long_value_is_quoted_as_an_excerpt(tmp_path):
    (tmp_path / "long.yaml").write_text(GOOD.replace("micro_batch: [2]", f"micro_batch: ['{'9' * 400_000}']")
                                        + "name: long\n")
    proc, _ = dpo("validate", "long.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "search.micro_batch" in proc.stderr
    assert "999..." in proc.stderr and len(proc.stderr) < 1000


@pytest.mark.parametrize("name, problem", [
    ("../escaped", "path separator"),
    ("/tmp/abs-name", "path separator"),
    ('"two\\nlines"', "control character"),
    ('"red\\e[31m"', "control character"),
    ("..", "not a folder name"),
])
def test_a_name_that_is_no_folder_name_is_refused_and_nothing_is_written(tmp_path, name, problem):
    work = tmp_path / "work"
    (work / "reports").mkdir(parents=True)
    (work / "space.yaml").write_text(f"name: {name}\n{GOOD}")
    (tmp_path / "data.json").write_text("mine")
    for command in ("validate", "run"):
        proc, _ = dpo(command, "space.yaml", cwd=work)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"name: {'is not a folder name' if problem == 'not a folder name' else 'holds a'}" in proc.stderr
        assert problem in proc.stderr and "\x1b" not in proc.stderr
    assert (tmp_path / "data.json").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [
        "data.json", "work"]
    assert list((work / "reports").iterdir()) == []


def test_a_fifo_is_not_called_missing(tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    proc, _ = dpo("validate", "pipe.yaml", cwd=tmp_path, timeout_s=30)
    assert proc.returncode == 2 and "not a regular file (a pipe, device or socket)" in proc.stderr, proc.stderr
    os.mkfifo(tmp_path / "pairs.jsonl")
    (tmp_path / "s.yaml").write_text(GOOD.replace("{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}",
                                                  "{path: pairs.jsonl}") + "name: fifo-data\n")
    proc, _ = dpo("validate", "s.yaml", cwd=tmp_path, timeout_s=60)
    assert proc.returncode == 2 and "data.path: pairs.jsonl: not a regular file" in proc.stderr, proc.stderr


def test_validating_a_large_data_file_says_it_is_tokenising(tmp_path):
    import json

    with (tmp_path / "pairs.jsonl").open("w") as fh:
        for i in range(50_000):
            fh.write(json.dumps({"prompt": f"q{i}", "chosen": "yes", "rejected": "no"}) + "\n")
    (tmp_path / "s.yaml").write_text(GOOD.replace("{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}",
                                                  "{path: pairs.jsonl}") + "name: big-data\n")
    proc, _ = dpo("validate", "s.yaml", cwd=tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data pairs.jsonl: tokenising 50,000 rows with the tiny-llama tokenizer" in proc.stderr
