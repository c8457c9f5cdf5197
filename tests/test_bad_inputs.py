"""Bad input is stopped before any work: exit 2, a message naming the file and line (or field,
or column) and the fix, no traceback, and nothing written or lost.

A corpus of bad inputs per class - data files, model folders, output folders, results files -
each run through every command that takes it (in-process, so the tests are fast). One
subprocess test shows that ``run`` with bad data never starts Ray.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from dpo_sweep.analysis.results import load_results
from dpo_sweep.records import TrialResult, write_results
from dpo_sweep.cli import main
from dpo_sweep.models import pretrained
from dpo_sweep.train.sources import read_file

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"prompt": "What is 2+2?", "chosen": "Four.", "rejected": "Five."}
MESSAGES_FIX = "expected a string or a list of {role, content} messages"


# --- helpers ----------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes] | None:
    """Every file under ``folder`` with its bytes (None: the folder does not exist)."""
    if not folder.exists():
        return None
    if folder.is_file():
        return {"": folder.read_bytes()}
    return {str(p.relative_to(folder)): (b"<dir>" if p.is_dir() else p.read_bytes()) for p in folder.rglob("*")}


def refused(capsys, argv: list[str], needles: tuple[str, ...], watched: Path | None = None) -> str:
    """Run the CLI; assert exit 2, every needle in stderr, no traceback, ``watched`` unchanged."""
    before = snapshot(watched) if watched is not None else None
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2, captured.out + captured.err
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    for needle in needles:
        assert needle in captured.err, f"{needle!r} not in: {captured.err}"
    if watched is not None:
        assert snapshot(watched) == before, "the command wrote or changed something"
    return captured.err


def write_space(folder: Path, *, data: str, model: str = "{preset: tiny-llama}", extra: str = "") -> Path:
    path = folder / "space.yaml"
    path.write_text(f"name: bad\nmodel: {model}\ndata: {data}\n"
                    "train: {steps: 2, warmup_steps: 0, precision: fp32, max_length: 64}\n"
                    f"resources: {{use_gpu: false}}\n{extra}")
    return path


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet_bytes(frame: pd.DataFrame) -> Callable[[Path], None]:
    return lambda p: frame.to_parquet(p)


def command_argv(command: str, space: Path, out: Path) -> list[str]:
    if command == "validate":
        return ["validate", str(space)]
    if command == "run":
        return ["run", str(space), "--output", str(out), "--no-dashboard"]
    return ["trial", str(space), "--output", str(out)]


# --- data files -------------------------------------------------------------------------------
# (file name, its content (bytes, or a writer), extra space lines, needles: where + the fix)
DATA_CASES = {
    "chosen-int": ("d.jsonl", jsonl(GOOD, {**GOOD, "chosen": 3}), "",
                   ("d.jsonl: line 2: 'chosen' is int (3)", MESSAGES_FIX)),
    "rejected-float": ("d.jsonl", jsonl(GOOD, GOOD, {**GOOD, "rejected": 1.5}), "",
                       ("d.jsonl: line 3: 'rejected' is float (1.5)", MESSAGES_FIX)),
    "chosen-bool": ("d.jsonl", jsonl({**GOOD, "chosen": True}), "", ("d.jsonl: line 1: 'chosen' is bool", MESSAGES_FIX)),
    "chosen-null": ("d.jsonl", jsonl(GOOD, {**GOOD, "chosen": None}), "",
                    ("d.jsonl: line 2: 'chosen' is missing", MESSAGES_FIX)),
    "chosen-list-of-ints": ("d.jsonl", jsonl({**GOOD, "chosen": [1, 2]}), "",
                            ("d.jsonl: line 1: 'chosen' is list", MESSAGES_FIX)),
    "prompt-dict": ("d.jsonl", jsonl(GOOD, {**GOOD, "prompt": {"text": "hi"}}), "",
                    ("d.jsonl: line 2: 'prompt' is dict", "expected a string or a list of {role, content}")),
    "prompt-int": ("d.jsonl", jsonl({**GOOD, "prompt": 7}), "", ("d.jsonl: line 1: 'prompt' is int (7)", "or no prompt")),
    "column-missing": ("d.jsonl", jsonl({"prompt": "a", "chosen": "b"}), "",
                       ("d.jsonl: line 1: column 'rejected' is missing", "data.columns: {rejected:")),
    "column-missing-later-row": ("d.jsonl", jsonl(GOOD, GOOD, {"prompt": "a", "chosen": "b"}), "",
                                 ("d.jsonl: line 3: 'rejected' is missing", MESSAGES_FIX)),
    "column-map-to-nothing": ("d.jsonl", jsonl(GOOD), "  columns: {chosen: good}\n",
                              ("d.jsonl: line 1: data.columns maps chosen to column 'good', which is not there",
                               "fix the name in data.columns")),
    "empty-file": ("d.jsonl", b"", "", ("d.jsonl: the file holds no pairs", "it needs rows with 'chosen' and 'rejected'")),
    "blank-lines-only": ("d.jsonl", b"\n  \n\n", "", ("d.jsonl: the file holds no pairs", "'chosen' and 'rejected'")),
    "bad-json-line-3": ("d.jsonl", jsonl(GOOD, GOOD) + b'{"prompt": "a", "chosen": \n', "",
                        ("d.jsonl: line 3: not valid JSON", "each line holds one pair object")),
    "bad-json-after-blank-line": ("d.jsonl", jsonl(GOOD) + b"\n" + b"{oops}\n", "",
                                  ("d.jsonl: line 3: not valid JSON", "each line holds one pair")),
    "line-not-an-object": ("d.jsonl", jsonl(GOOD, [1, 2]), "", ("d.jsonl: line 2: expected an object", "chosen/rejected")),
    "line-over-the-cap": ("d.jsonl", jsonl(GOOD) + jsonl({**GOOD, "chosen": "c" * 1_000_000}), "",
                          ("d.jsonl: line 2: longer than 1,000,000 bytes, the most a line may hold",
                           "shorten or drop that pair")),
    "not-utf8": ("d.jsonl", jsonl(GOOD) + b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n', "",
                 ("d.jsonl: line 2: not UTF-8 text", "save the file as UTF-8")),
    "chat-and-string-mixed": ("d.jsonl", jsonl({**GOOD, "rejected": [{"role": "assistant", "content": "b"}]}), "",
                              ("d.jsonl: line 1: 'chosen' and 'rejected' must both be", "strings or both message lists")),
    "no-prompt-no-shared-start": ("d.jsonl", jsonl({"chosen": "abc", "rejected": "xyz"}), "",
                                  ("d.jsonl: line 1: there is no prompt column", "add a 'prompt' column")),
    "nothing-fits-max-length": ("d.jsonl", jsonl({"prompt": "p" * 60, "chosen": "c" * 80, "rejected": "r" * 80}),
                                "  min_response_tokens: 70\n",
                                ("d.jsonl: no pair left after truncation to max_length=64", "raise train.max_length")),
    "too-few-pairs-for-micro-batch": ("d.jsonl", jsonl(GOOD), "search: {micro_batch: [2]}\n",
                                      ("d.jsonl: 1 pair", "cannot fill one effective batch of micro_batch 2 x "
                                       "grad_acc 1 x 1 worker", "use more pairs or a smaller micro_batch")),
    "too-few-pairs-for-grad-acc": ("d.jsonl", jsonl(GOOD) * 2, "search: {micro_batch: [1], grad_acc: [3]}\n",
                                   ("d.jsonl: 2 pair", "cannot fill one effective batch of micro_batch 1 x "
                                    "grad_acc 3 x 1 worker", "smaller micro_batch or grad_acc")),
    "json-not-a-list": ("d.json", json.dumps({"rows": [GOOD]}).encode(), "",
                        ("d.json: expected a list of pair objects", "got dict", ".jsonl")),
    "json-a-number": ("d.json", b"42", "", ("d.json: expected a list of pair objects", "got int")),
    "json-bad-syntax-line-3": ("d.json", b'[\n  {"prompt": "a", "chosen": "b", "rejected": "c"},\n  {oops}\n]', "",
                               ("d.json: line 3 column 4: not valid JSON", "a .json file holds a list of pair objects")),
    "json-element-not-object": ("d.json", json.dumps([GOOD, "text"]).encode(), "",
                                ("d.json: element 2 (index 1): expected an object", "chosen/rejected")),
    "json-element-chosen-int": ("d.json", json.dumps([GOOD, GOOD, {**GOOD, "chosen": 5}]).encode(), "",
                                ("d.json: element 3 (index 2): 'chosen' is int (5)", MESSAGES_FIX)),
    "parquet-chosen-int-column": ("d.parquet", parquet_bytes(pd.DataFrame({"prompt": ["a", "b"], "chosen": [1, 2],
                                                                           "rejected": ["x", "y"]})), "",
                                  ("d.parquet: row 1 (index 0): 'chosen' is int (1)", MESSAGES_FIX)),
    "parquet-rejected-float-later-row": ("d.parquet", parquet_bytes(pd.DataFrame(
        {"prompt": ["a", "b"], "chosen": ["x", "y"], "rejected": ["z", None]})), "",
        ("d.parquet: row 2 (index 1): 'rejected' is missing", MESSAGES_FIX)),
    "parquet-column-missing": ("d.parquet", parquet_bytes(pd.DataFrame({"prompt": ["a"], "chosen": ["b"]})), "",
                               ("d.parquet: row 1 (index 0): column 'rejected' is missing", "data.columns")),
    "parquet-not-parquet": ("d.parquet", b"this is not parquet", "",
                            ("d.parquet: not a readable parquet file", "to_parquet")),
    "no-such-file": (None, None, "", ("data.path:", "missing.jsonl: no such file", "give an existing .json, .jsonl or .parquet")),
    "unsupported-type": ("d.csv", b"prompt,chosen,rejected\na,b,c\n", "",
                         ("d.csv: unsupported file type '.csv'", "use .json, .jsonl or .parquet")),
}


def make_data(folder: Path, name: str | None, content: bytes | Callable[[Path], None] | None) -> Path:
    if name is None:
        return folder / "missing.jsonl"
    path = folder / name
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("command", ["validate", "run", "trial"])
@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data_is_refused_before_any_work(tmp_path, capsys, command, case):
    name, content, extra, needles = DATA_CASES[case]
    data = make_data(tmp_path, name, content)
    data_lines = "".join(line for line in extra.splitlines(keepends=True) if line.startswith("  "))
    other = "".join(line for line in extra.splitlines(keepends=True) if not line.startswith("  "))
    space = write_space(tmp_path, data=f"\n  path: {data}\n{data_lines}", extra=other)
    out = tmp_path / "out"
    refused(capsys, command_argv(command, space, out), needles, watched=tmp_path)
    assert not out.exists()


def test_run_keeps_earlier_results_when_the_data_is_bad(tmp_path, capsys):
    """Without --resume a sweep sets earlier results aside; a refused one must not even do that."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("trial_id,status\nold,ok\n")
    (out / "steps.csv").write_text("trial_id,step\nold,1\n")
    data = make_data(tmp_path, "d.jsonl", jsonl({**GOOD, "chosen": 3}))
    space = write_space(tmp_path, data=f"{{path: {data}}}")
    refused(capsys, ["run", str(space), "--output", str(out), "--no-dashboard"], ("d.jsonl: line 1",), watched=out)


@pytest.mark.parametrize("name, rows", [
    ("bom.jsonl", lambda: "\ufeff" + json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n"),
    ("bom.json", lambda: "\ufeff" + json.dumps([GOOD, GOOD])),
])
def test_a_utf8_bom_is_simply_read(tmp_path, capsys, name, rows):
    path = tmp_path / name
    path.write_bytes(rows().encode("utf-8"))
    src = read_file(path)
    assert src.rows == [GOOD, GOOD]
    space = write_space(tmp_path, data=f"{{path: {path}}}")
    assert main(["validate", str(space)]) == 0
    assert f"data {path}: 2 pair" in capsys.readouterr().out


def test_jsonl_line_numbers_are_the_editors(tmp_path):
    """Blank lines count; a raw line separator (U+2028) inside a JSON string starts no new line."""
    path = tmp_path / "d.jsonl"
    odd = json.dumps({**GOOD, "prompt": "one\u2028two"}, ensure_ascii=False).encode()
    path.write_bytes(jsonl(GOOD) + b"\n\n" + odd + b"\r\n" + jsonl(GOOD))
    src = read_file(path)
    assert src.numbers == (1, 4, 5) and src.where(2) == f"{path}: line 5"
    assert src.rows[1]["prompt"] == "one\u2028two"


# --- model folders ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A complete tiny local checkpoint: config, weights and the byte tokenizer (no download)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dpo_sweep.models.presets import preset_config
    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    folder = tmp_path_factory.mktemp("ckpt") / "tiny"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(preset_config("tiny-llama")).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return folder


def variant(checkpoint: Path, tmp_path: Path, drop: tuple[str, ...] = (), write: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "variant"
    shutil.copytree(checkpoint, folder)
    for name in drop:
        (folder / name).unlink(missing_ok=True)
    for name, text in (write or {}).items():
        (folder / name).write_text(text)
    return folder


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
MODEL_CASES: dict[str, tuple[Callable[[Path, Path], str], tuple[str, ...]]] = {
    "missing-absolute-dir": (lambda ck, tmp: str(tmp / "nowhere"),
                             ("model.name_or_path: no such directory: ", "nowhere", "give a checkpoint directory")),
    "missing-relative-dir": (lambda ck, tmp: "./no/such/ckpt",
                             ("model.name_or_path: no such directory: ./no/such/ckpt", "or a hub id such as")),
    "not-a-hub-id-either": (lambda ck, tmp: "my checkpoint",
                            ("no such directory: my checkpoint (and not a hub id either)",)),
    "a-file-not-a-dir": (lambda ck, tmp: str(ck / "config.json"), ("config.json is a file, not a directory",)),
    "no-config": (lambda ck, tmp: str(variant(ck, tmp, drop=("config.json",))),
                  ("variant: the folder lacks config.json", "save_pretrained(DIR)")),
    "no-tokenizer-files": (lambda ck, tmp: str(variant(ck, tmp, drop=TOKENIZER_FILES)),
                           ("variant: the folder lacks one of tokenizer.json, tokenizer.model", "tokenizer.save_pretrained")),
    "no-weights": (lambda ck, tmp: str(variant(ck, tmp, drop=("model.safetensors",))),
                   ("variant: the folder lacks one of model.safetensors", "add the missing files")),
    "config-not-json": (lambda ck, tmp: str(variant(ck, tmp, write={"config.json": "{not json"})),
                        ("variant: could not load the model config", "check the files in it")),
    "config-without-model-type": (lambda ck, tmp: str(variant(ck, tmp, write={"config.json": "{}"})),
                                  ("variant: could not load the model config", "model_type")),
    "tokenizer-without-eos-or-pad": (lambda ck, tmp: str(variant(ck, tmp, write={
        "tokenizer_config.json": '{"tokenizer_class": "PreTrainedTokenizerFast"}', "special_tokens_map.json": "{}"})),
        ("variant: the tokenizer has neither a pad nor an end-of-sequence token", "set eos_token (or pad_token)")),
    "tokenizer-json-broken": (lambda ck, tmp: str(variant(ck, tmp, write={"tokenizer.json": "{broken"})),
                              ("variant: could not load the tokenizer", "check the files in it")),
}


@pytest.mark.parametrize("command", ["validate", "run", "trial"])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_bad_model_is_refused_before_any_work(tmp_path, capsys, checkpoint, command, case):
    make, needles = MODEL_CASES[case]
    name = make(checkpoint, tmp_path)
    space = write_space(tmp_path, data="{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}",
                        model=json.dumps({"name_or_path": name}))
    out = tmp_path / "out"
    refused(capsys, command_argv(command, space, out), needles, watched=tmp_path)
    assert not out.exists()


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_tokenizer_beyond_the_models_vocabulary_is_refused(tmp_path, capsys, checkpoint, command):
    """A tokenizer saved from another model: its ids (up to 258 here) overflow a 200-row embedding."""
    config = json.loads((checkpoint / "config.json").read_text())
    folder = variant(checkpoint, tmp_path, write={"config.json": json.dumps({**config, "vocab_size": 200})})
    data = make_data(tmp_path, "d.jsonl", jsonl(GOOD, GOOD))
    space = write_space(tmp_path, data=f"{{path: {data}}}", model=json.dumps({"name_or_path": str(folder)}))
    refused(capsys, command_argv(command, space, tmp_path / "out"),
            ("d.jsonl: the ", "tokenizer gives token id 25", "has a vocabulary of 200",
             "use the tokenizer saved with this model"), watched=tmp_path)


def test_a_bad_model_among_swept_models_is_refused(tmp_path, capsys, checkpoint):
    space = write_space(tmp_path, data="{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}",
                        extra=f"search: {{model: [tiny-llama, {{name_or_path: {tmp_path / 'gone'}}}]}}\n")
    refused(capsys, ["validate", str(space)], ("no such directory: ", "gone"))


def test_a_complete_checkpoint_and_real_data_validate(tmp_path, capsys, checkpoint):
    """The positive control of the cases above: the folder they break is accepted whole."""
    data = make_data(tmp_path, "d.jsonl", jsonl(GOOD, GOOD, GOOD))
    space = write_space(tmp_path, data=f"{{path: {data}}}", model=json.dumps({"name_or_path": str(checkpoint)}))
    assert main(["validate", str(space)]) == 0
    assert f"data {data}: 3 pair(s) with the {checkpoint} tokenizer" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["gpt2", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2-7B"])
def test_hub_ids_stay_allowed(name):
    assert pretrained.locate(name).local_dir is None


def test_an_unreachable_hub_is_a_clear_message(tmp_path, capsys, monkeypatch):
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    space = write_space(tmp_path, data="{synthetic: {pairs: 8}}", model="{name_or_path: some-org/some-model}")
    refused(capsys, ["validate", str(space)],
            ("model.name_or_path: hub id 'some-org/some-model': could not load the model config",
             "that the hub is reachable"))


# --- output folders ---------------------------------------------------------------------------


def _output_file(tmp: Path) -> Path:
    (tmp / "taken").write_text("keep me")
    return tmp / "taken"


def _under_a_file(tmp: Path) -> Path:
    (tmp / "taken").write_text("keep me")
    return tmp / "taken" / "sub" / "dir"


def _results_csv_is_a_folder(tmp: Path) -> Path:
    (tmp / "out" / "results.csv").mkdir(parents=True)
    return tmp / "out"


OUTPUT_CASES = {
    "an-existing-file": (_output_file, ("taken: this is an existing file, not a directory", "give a directory")),
    "a-path-under-a-file": (_under_a_file, ("taken is a file, so no directory can be created under it",)),
    "results-csv-is-a-folder": (_results_csv_is_a_folder, ("results.csv exists and is not a file", "move it away")),
}


@pytest.mark.parametrize("command", ["run", "trial"])
@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
def test_bad_output_is_refused_before_any_work(tmp_path, capsys, command, case):
    make, needles = OUTPUT_CASES[case]
    out = make(tmp_path)
    space = write_space(tmp_path, data="{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}")
    refused(capsys, command_argv(command, space, out), (f"--output {out}", *needles), watched=tmp_path)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a read-only /proc")
@pytest.mark.parametrize("command", ["run", "trial"])
def test_an_unwritable_output_is_refused(tmp_path, capsys, command):
    """/proc refuses new files even to root (for whom permission bits do not count)."""
    space = write_space(tmp_path, data="{synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}")
    refused(capsys, command_argv(command, space, Path("/proc/dpo-sweep-out")),
            ("/proc is not writable", "give a folder you can write to"), watched=tmp_path)


# --- results files ----------------------------------------------------------------------------


def results_dir(tmp_path: Path, edit: Callable[[list[dict[str, str]]], None]) -> Path:
    """A results.csv as the sweep writes it (3 rows, an error message over two lines in row 1),
    then hand-edited by ``edit``."""
    out = tmp_path / "r"
    rows = [TrialResult(trial_id=f"t{i}", status="ok", model="tiny-llama", seq_len=64, micro_batch=2 ** i,
                        checkpoint_level="none", grad_acc=1, beta=0.1, workers_per_trial=1, effective_batch=2 ** i,
                        peak_mem_gb=1.0 + i, step_time_ms=100.0 + i, tokens_per_s=1000.0, loss_std=0.01,
                        error="first line\nsecond line" if i == 0 else "")
            for i in range(3)]
    write_results(out, rows)
    with (out / "results.csv").open(newline="") as fh:
        table = list(csv.DictReader(fh))
    edit(table)
    with (out / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    return out


def cell(row: int, column: str, value: str) -> Callable[[list[dict[str, str]]], None]:
    return lambda table: table[row].__setitem__(column, value)


def drop_column(column: str) -> Callable[[list[dict[str, str]]], None]:
    return lambda table: [r.pop(column) for r in table]


# Row 0 spans lines 2-3 (its error message has a line break), so row 1 is line 4, row 2 line 5.
RESULTS_CASES = {
    "bad-number": (cell(1, "peak_mem_gb", "abc"), ("line 4 (trial t1), column peak_mem_gb: 'abc' is not a number",)),
    "bad-int": (cell(2, "micro_batch", "two"), ("line 5 (trial t2), column micro_batch: 'two' is not a whole number",)),
    "fractional-int": (cell(1, "grad_acc", "1.5"), ("line 4 (trial t1), column grad_acc: '1.5' is not a whole number",)),
    "unknown-status": (cell(2, "status", "weird"), ("line 5 (trial t2), column status: 'weird' is not allowed",
                                                    "use one of ok, oom, diverged, error, pruned")),
    "empty-status": (cell(0, "status", ""), ("line 2 (trial t0), column status: '' is not allowed",)),
    "bad-bool": (cell(1, "lean_ops", "maybe"), ("line 4 (trial t1), column lean_ops: 'maybe' is not true or false",)),
    "bad-optional-number": (cell(0, "mfu", "fast"), ("line 2 (trial t0), column mfu: 'fast' is not a number",)),
    "bad-step-time": (cell(2, "step_time_ms", "12 ms"), ("column step_time_ms: '12 ms' is not a number",)),
    "missing-required-column": (drop_column("peak_mem_gb"), ("lacks the column(s) peak_mem_gb",
                                                              "the results.csv contract needs at least")),
}


@pytest.mark.parametrize("command", ["report", "recommend"])
@pytest.mark.parametrize("case", sorted(RESULTS_CASES))
def test_unreadable_results_are_refused(tmp_path, capsys, command, case):
    edit, needles = RESULTS_CASES[case]
    out = results_dir(tmp_path, edit)
    argv = [command, str(out)] + (["--memory-budget-gb", "10"] if command == "recommend" else [])
    err = refused(capsys, argv, (f"{out / 'results.csv'}", *needles), watched=out)
    if case != "missing-required-column":
        assert "correct them" in err and "re-run the sweep" in err


def test_every_bad_cell_is_listed(tmp_path, capsys):
    out = results_dir(tmp_path, lambda t: [cell(i, "beta", "x")(t) for i in range(3)])
    err = refused(capsys, ["report", str(out)], ("3 cell(s) cannot be read",), watched=out)
    assert [ln.split(",")[0].strip() for ln in err.splitlines()[1:]] == ["line 2 (trial t0)", "line 4 (trial t1)",
                                                                         "line 5 (trial t2)"]


def test_line_numbers_skip_what_pandas_skips(tmp_path, capsys):
    out = results_dir(tmp_path, cell(2, "beta", "x"))
    text = (out / "results.csv").read_text()
    head, rest = text.split("\n", 1)
    (out / "results.csv").write_text(head + "\n\n   \n" + rest)  # a blank and a whitespace-only line
    refused(capsys, ["report", str(out)], ("line 7 (trial t2), column beta: 'x' is not a number",), watched=out)


def test_a_bad_steps_csv_cell_is_refused(tmp_path, capsys):
    out = results_dir(tmp_path, lambda t: None)
    (out / "steps.csv").write_text("trial_id,step,loss,peak_mem_gb\nt0,1,0.69,1.0\nt0,two,0.68,1.0\n")
    refused(capsys, ["report", str(out)], ("steps.csv", "line 3 (trial t0), column step: 'two' is not a whole number"),
            watched=out)


def test_empty_and_blank_cells_stay_missing(tmp_path):
    out = results_dir(tmp_path, lambda t: (cell(1, "peak_mem_gb", "")(t), cell(2, "loss_std", "  ")(t),
                                           cell(0, "status", " OK ")(t)))
    df = load_results(out)
    assert math.isnan(df.loc[1, "peak_mem_gb"]) and math.isnan(df.loc[2, "loss_std"])
    assert df["status"].tolist() == ["ok", "ok", "ok"] and df["micro_batch"].tolist() == [1, 2, 4]
    assert df["lean_ops"].tolist() == [False, False, False]


def test_true_false_columns_take_words_and_digits(tmp_path):
    out = results_dir(tmp_path, lambda t: (cell(0, "lean_ops", "1")(t), cell(1, "lean_ops", "")(t),
                                           cell(2, "lean_ops", "0")(t), cell(0, "liger_kernel", "TRUE")(t)))
    df = load_results(out)
    assert df.loc[0, "lean_ops"] == 1 and math.isnan(df.loc[1, "lean_ops"]) and df.loc[2, "lean_ops"] == 0
    assert df["liger_kernel"].tolist() == [True, False, False]


# --- run never reaches Ray --------------------------------------------------------------------


def test_run_with_bad_data_exits_2_before_ray_starts(tmp_path):
    data = make_data(tmp_path, "d.jsonl", jsonl(GOOD, {**GOOD, "chosen": 3}))
    space = write_space(tmp_path, data=f"{{path: {data}}}", extra="search: {micro_batch: [1, 2], beta: [0.1, 0.2]}\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", str(out), "--no-dashboard"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    elapsed_s = time.monotonic() - started
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "d.jsonl: line 2: 'chosen' is int" in proc.stderr
    assert "Ray" not in text and "Traceback" not in text and len(text.splitlines()) == 1
    assert not out.exists()
    assert elapsed_s < 120  # imports only; a started Ray and 4 failing trials take minutes here
