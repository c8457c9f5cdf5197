"""What `validate` (and `run`, which prints the same lines) says about the data it read: the
layout (plain strings or chat messages, where the prompt came from, the data.columns mapping),
that chat messages got the plain rendering when the tokenizer has no chat template, and a note
counting pairs whose chosen and rejected responses are the same."""
from __future__ import annotations

import json

from dpo_sweep.cli import main
from dpo_sweep.train.data import layout_text


def _validate(tmp_path, capsys, rows, columns: str = "") -> str:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    space = tmp_path / "space.yaml"
    space.write_text(f"name: notes\nmodel: {{preset: tiny-llama}}\ndata: {{path: {data}{columns}}}\n"
                     "train: {steps: 2, warmup_steps: 0, precision: fp32, max_length: 64}\n"
                     "resources: {use_gpu: false}\nsearch: {micro_batch: [1]}\n")
    assert main(["validate", str(space)]) == 0
    return capsys.readouterr().out


def test_identical_chosen_and_rejected_are_counted_in_a_note(tmp_path, capsys):
    rows = [{"prompt": "2+2?", "chosen": "Four.", "rejected": "Five."}] + \
        [{"prompt": f"Q{i}?", "chosen": "Same.", "rejected": "Same."} for i in range(3)]
    out = _validate(tmp_path, capsys, rows)
    assert (f"note: data {tmp_path / 'pairs.jsonl'}: 3 pair(s) have identical chosen and rejected responses; "
            "they carry no preference") in out


def test_distinct_responses_give_no_note(tmp_path, capsys):
    out = _validate(tmp_path, capsys, [{"prompt": "2+2?", "chosen": "Four.", "rejected": "Five."}] * 2)
    assert "note:" not in out
    assert "pair(s) with the tiny-llama tokenizer at max_length 64 (0 truncated, 0 dropped); " \
        "read as plain strings\n" in out


def test_the_data_line_says_chat_messages_got_the_plain_rendering(tmp_path, capsys):
    user = {"role": "user", "content": "2+2?"}
    rows = [{"chosen": [user, {"role": "assistant", "content": "Four."}],
             "rejected": [user, {"role": "assistant", "content": "Five."}]}] * 2
    out = _validate(tmp_path, capsys, rows)
    assert ("read as chat messages; rendered as plain '<|role|>' text: the tokenizer has no chat template; "
            "prompt: the shared start of chosen and rejected\n") in out


def test_the_data_line_names_the_columns_mapping(tmp_path, capsys):
    rows = [{"q": "2+2?", "good": "Four.", "bad": "Five."}] * 2
    out = _validate(tmp_path, capsys, rows, columns=", columns: {prompt: q, chosen: good, rejected: bad}")
    assert "read as plain strings; columns mapped by data.columns (prompt: q, chosen: good, rejected: bad)" in out


def test_layout_of_mixed_rows_counts_each_kind():
    text = layout_text(chat_rows=2, plain_rows=3, implicit_prompts=1, columns={}, templated=True)
    assert text == ("3 row(s) of plain strings and 2 of chat messages; rendered with the tokenizer's chat "
                    "template; prompt: a column, or in 1 row(s) the shared start of chosen and rejected")
