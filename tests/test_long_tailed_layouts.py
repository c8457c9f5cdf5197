"""Long-tailed real layouts (chat messages, implicit prompts) through preflight: the lengths it
measures, data.json's counts, validate's predicted peak from the data's longest micro-batch."""
from __future__ import annotations

import json
import random

from dpo_sweep import preflight
from dpo_sweep import space as space_mod
from dpo_sweep.cli import main
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.core.trial_facts import planned_device
from dpo_sweep.train.batching import pair_length
from dpo_sweep.train.data import load_pairs
from dpo_sweep.train.tokenizer import byte_level_tokenizer
from tests.testkit import make_cfg


def long_tailed_rows(n: int, layout: str, seed: int = 0) -> list[dict]:
    """``n`` pairs whose reply lengths follow a lognormal tail, in one of the public layouts."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = f"question {i}: " + "why " * rng.randint(1, 6)
        good, bad = ("ok " * max(1, round(4 * rng.lognormvariate(0, 1))) for _ in range(2))
        if layout == "chat":
            user = [{"role": "user", "content": q}]
            rows.append({"chosen": user + [{"role": "assistant", "content": good}],
                         "rejected": user + [{"role": "assistant", "content": bad + "no"}]})
        else:  # implicit prompt: the shared start of chosen and rejected
            rows.append({"chosen": q + "A: " + good, "rejected": q + "B: " + bad})
    return rows


def write_space(tmp_path, rows, max_length=160, micro_batch=4):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    space = tmp_path / "space.yaml"
    space.write_text(f"name: lt\nmodel: {{preset: tiny-llama}}\ndata: {{path: {data}}}\n"
                     f"train: {{steps: 2, warmup_steps: 1, max_length: {max_length}, precision: fp32}}\n"
                     f"search: {{micro_batch: [{micro_batch}], checkpoint_level: [none], grad_acc: [1], beta: [0.1]}}\n")
    return space, data


def test_preflight_measures_lengths_of_each_layout(tmp_path):
    tok = byte_level_tokenizer()
    for layout in ("chat", "implicit"):
        rows = long_tailed_rows(120, layout)
        _, data = write_space(tmp_path, rows)
        cfg = make_cfg(data={"path": str(data)}, max_length=160)
        [summary] = preflight.check_inputs((cfg,))
        ds = load_pairs(cfg.data, tok, 160)
        assert summary.lengths.widths == tuple(pair_length(p) for p in ds.pairs)
        shape = summary.shape
        assert (shape["pairs"], shape["truncated"], shape["dropped"]) == (len(ds), ds.truncated, ds.dropped)
        assert ds.truncated > 0, layout  # the tail reaches past max_length
        assert shape["lengths"]["chosen"]["max"] > 3 * shape["lengths"]["chosen"]["median"], layout


def _predicted_column(out: str) -> list[str]:
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("trial_id"))
    start = lines[head].index("predicted peak (GB)")  # the plan column after it holds spaces
    end = start + len("predicted peak (GB)")
    return [line[start:end].strip() for line in lines[head + 1:] if line.strip()]


def test_validate_predicts_from_the_longest_micro_batch(tmp_path, capsys):
    space, data = write_space(tmp_path, long_tailed_rows(60, "implicit"), max_length=2048)
    assert main(["validate", str(space)]) == 0
    [shown] = _predicted_column(capsys.readouterr().out)
    [cfg] = space_mod.load(str(space)).trials
    [summary] = preflight.check_inputs((cfg,))
    assert max(summary.lengths.widths) < 2048  # no pair comes near max_length ...
    device = planned_device(cfg)
    want = predict_peak_gb(cfg, device=device, lengths=summary.lengths)
    assert shown == f"{want.total_gb:.1f}"
    # ... so the activations are a fraction of those of every sequence at max_length
    assert want.activations_gb < predict_peak_gb(cfg, device=device).activations_gb / 5
