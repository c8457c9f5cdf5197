"""Inputs past the limits, done for real with `dpo-sweep validate` on real files: a 50 MB line in a
JSONL file is refused with its line number in seconds and bounded memory (a process of its own);
NaN, infinities, integers past 64 bits and a key given twice are refused at validate, and so is a
weights file holding a pickled object, each with one line (exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpo_sweep.cli import main

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"prompt": "What is 2+2?", "chosen": "Four.", "rejected": "Five."}
#: validate in a process of its own, which says its peak memory (KiB) last on stderr: its own address
#: space's high-water mark (VmHWM). Not getrusage's ru_maxrss, which an exec'd child inherits from the
#: process that forked it (the kernel carries the old mm's high-water mark over at exec), so under a
#: test run holding 1.5 GB every child "peaked" there.
MEASURED = ("import re, sys\nfrom pathlib import Path\nfrom dpo_sweep.cli import main\nrc = main(sys.argv[1:])\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', Path('/proc/self/status').read_text()).group(1)\n"
            "print('maxrss_kib', hwm, file=sys.stderr)\nsys.exit(rc)\n")


def validate(*argv: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """The finished process, its seconds and its peak memory in GB."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", MEASURED, "validate", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    seconds = time.monotonic() - start
    kib = int(done.stderr.strip().splitlines()[-1].split()[-1])
    return done, seconds, kib * 1024 / 1e9


def test_a_50_mb_line_is_refused_with_its_number_in_seconds_and_bounded_memory(tmp_path):
    data = tmp_path / "d.jsonl"
    with data.open("w") as fh:
        fh.write(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
        fh.write(json.dumps({**GOOD, "chosen": "c" * 50_000_000}) + "\n")
    space = tmp_path / "s.yaml"
    space.write_text(f"name: big\nmodel: {{preset: tiny-llama}}\ndata: {{path: {data}}}\n"
                     "train: {steps: 2, warmup_steps: 0, precision: fp32, max_length: 64}\nresources: {use_gpu: false}\n")
    done, seconds, peak_gb = validate(str(space))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{data}: line 3: longer than 1,000,000 bytes" in done.stderr and "Traceback" not in done.stderr
    assert seconds < 30 and peak_gb < 1.5, (seconds, peak_gb)


SPACE = ("name: v\nmodel: {preset: tiny-llama}\ndata: {synthetic: {pairs: 16, prompt_tokens: 8, response_tokens: 8}}\n"
         "train: {steps: 2, warmup_steps: 0, precision: fp32, max_length: 64%s}\nresources: {use_gpu: false}\n%s")


def one_line_refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("train, search, needle", [
    ("", "search: {beta: [.nan]}\n", "search.beta[0]: nan is not allowed; give a finite number"),
    ("", "search: {beta: [0.1, .inf]}\n", "search.beta[1]: inf is not allowed; give a finite number"),
    (", seed: 12345678901234567890123", "", "train.seed: 12345678901234567890123 (23 digits) is out of range; "
     "give an integer of at most 9,223,372,036,854,775,807 (64 bits)"),
    ("", "search:\n  micro_batch: [1]\n  micro_batch: [2]\n",
     "line 8: key 'micro_batch' is given twice in one mapping (first on line 7)"),
])
def test_a_value_no_setting_takes_is_one_line_at_validate(tmp_path, capsys, train, search, needle):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE % (train, search))
    assert f"{space}: {needle}" in one_line_refusal(capsys, ["validate", str(space)])


def test_an_infinity_given_with_set_is_refused_too(tmp_path, capsys):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE % ("", ""))
    assert "train.lr: inf is not allowed" in one_line_refusal(capsys, ["validate", str(space), "--set", "train.lr=.inf"])


class Payload:
    """Not a tensor: torch's safe loader refuses to build it."""


def test_a_weights_file_holding_a_pickled_object_is_named_in_one_line(tmp_path, capsys):
    from family_checkpoints import save_family_checkpoint

    ckpt = save_family_checkpoint("llama", tmp_path / "ck")
    capsys.readouterr()  # its saving progress
    (ckpt / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload()}, ckpt / "pytorch_model.bin")
    space = tmp_path / "s.yaml"
    space.write_text(SPACE.replace("{preset: tiny-llama}", f"{{name_or_path: {ckpt}}}") % ("", ""))
    err = one_line_refusal(capsys, ["validate", str(space)])
    assert f"model.name_or_path: {ckpt / 'pytorch_model.bin'}: the weights file holds a pickled object" in err
    assert "Unsupported global" in err and "save_pretrained (safetensors)" in err
