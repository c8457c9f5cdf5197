"""`dpo-sweep run` refuses invalid space files before anything starts: exit 2, and the message
names the key at fault (and no Ray cluster, no results directory)."""
from __future__ import annotations

import textwrap

import pytest

from dpo_sweep.cli import main

VALID = {
    "name": "name: bad",
    "model": "model: {preset: tiny-llama}",
    "data": "data: {synthetic: {pairs: 16, prompt_tokens: 24, response_tokens: 23}}",
    "train": "train: {steps: 3, warmup_steps: 1, max_length: 64, precision: fp32}",
    "resources": "resources: {workers_per_trial: 1, use_gpu: false}",
    "search": "search: {micro_batch: [2], checkpoint_level: [none]}",
}

# (case id, the sections replaced (None drops one), a text the error message must contain)
CASES = [
    ("missing-name", {"name": None}, "name"),
    ("unknown-preset", {"model": "model: {preset: gpt-9}"}, "model.preset"),
    ("two-model-sources", {"model": "model: {preset: tiny-llama, name_or_path: /m}"}, "model.preset"),
    ("missing-data", {"data": None}, "data"),
    ("two-data-sources", {"data": "data: {synthetic: {pairs: 4}, path: p.jsonl}"}, "data.synthetic"),
    ("zero-pairs", {"data": "data: {synthetic: {pairs: 0}}"}, "data.synthetic.pairs"),
    ("zero-steps", {"train": "train: {steps: 0, warmup_steps: 0}"}, "train.steps"),
    ("warmup-not-below-steps", {"train": "train: {steps: 2, warmup_steps: 2}"}, "train.warmup_steps"),
    ("unknown-precision", {"train": "train: {precision: fp8}"}, "train.precision"),
    ("unknown-loss", {"train": "train: {loss: kto}"}, "train.loss"),
    ("misspelt-train-key", {"train": "train: {stpes: 3}"}, "train.stpes"),
    ("max-length-too-small", {"train": "train: {max_length: 4}"}, "train.max_length"),
    ("refused-L4", {"search": "search: {checkpoint_level: [none, L4]}"}, "L4"),
    ("unknown-level", {"search": "search: {checkpoint_level: [L9]}"}, "search.checkpoint_level"),
    ("zero-micro-batch", {"search": "search: {micro_batch: [0]}"}, "search.micro_batch"),
    ("empty-micro-batch", {"search": "search: {micro_batch: []}"}, "search.micro_batch"),
    ("grad-acc-and-effective", {"search": "search: {grad_acc: [1], effective_batch: [8]}"}, "effective_batch"),
    ("effective-not-divisible", {"search": "search: {micro_batch: [4], effective_batch: [6]}"},
     "search.effective_batch"),
    ("negative-beta", {"search": "search: {beta: [-0.1]}"}, "search.beta"),
    ("unknown-dimension", {"search": "search: {learning_rate: [1.0e-4]}"}, "search.learning_rate"),
    ("bad-swept-train-field", {"search": "search: {precision: [fp32, fp8]}"}, "search.precision"),
    ("unknown-search-mode", {"search": "search: {mode: bayes}"}, "search.mode"),
    ("sampler-keys-moved", {"search": "search: {mode: random, num_samples: 4}"}, "sampler: {mode"),
    ("unknown-sampler-mode", {"search": VALID["search"] + "\nsampler: {mode: bayes}"}, "sampler.mode"),
    ("duplicate-micro-batch", {"search": "search: {micro_batch: [2, 2]}"}, "search.micro_batch: 2 is listed twice"),
    ("label-smoothing-with-ipo", {"train": "train: {loss: ipo, label_smoothing: 0.1}"}, "train.label_smoothing"),
    ("label-smoothing-with-every-swept-loss-refusing-it",
     {"train": "train: {label_smoothing: 0.1}", "search": "search: {loss: [ipo, hinge]}"}, "train.label_smoothing"),
    ("zero-workers", {"resources": "resources: {workers_per_trial: 0}"}, "resources.workers_per_trial"),
    ("bad-use-gpu", {"resources": "resources: {use_gpu: maybe}"}, "resources.use_gpu"),
    ("zero-cpus-per-worker", {"resources": "resources: {cpus_per_worker: 0}"}, "resources.cpus_per_worker"),
    ("bad-objective", {"search": VALID["search"] + "\nobjectives: {memory: smallest}"}, "objectives.memory"),
    ("misspelt-section", {"search": "serach: {micro_batch: [2]}"}, "serach"),
]


def _write(tmp_path, case_id: str, replace: dict) -> str:
    sections = {**VALID, **replace}
    text = "\n".join(v for v in sections.values() if v is not None) + "\n"
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_there_are_at_least_15_cases():
    assert len(CASES) >= 15


@pytest.mark.parametrize(("case_id", "replace", "key"), CASES, ids=[c[0] for c in CASES])
def test_invalid_space_exits_2_naming_the_key(tmp_path, capsys, case_id, replace, key):
    out = tmp_path / "out"
    rc = main(["run", _write(tmp_path, case_id, replace), "--output", str(out), "--no-dashboard"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert key in err, err
    assert not out.exists()  # refused before anything was written or started


def test_not_a_mapping_and_missing_file_exit_2(tmp_path, capsys):
    listing = tmp_path / "list.yaml"
    listing.write_text("- micro_batch\n- 2\n")
    assert main(["run", str(listing)]) == 2
    assert "mapping" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "absent.yaml")]) == 2
    assert "no such space file" in capsys.readouterr().err


def test_the_valid_base_is_valid(tmp_path, capsys):
    assert main(["validate", _write(tmp_path, "valid", {})]) == 0
