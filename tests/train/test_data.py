"""Loading preference pairs: formats, layouts, chat rendering, truncation, clear errors."""
import json

import pandas as pd
import pytest

from dpo_sweep.config import DataSpec
from dpo_sweep.errors import DataError
from dpo_sweep.train.batching import micro_batch_order, usable_pairs
from dpo_sweep.train.data import load_pairs, render_messages, truncate_pair
from dpo_sweep.train.tokenizer import byte_level_tokenizer

ROWS = [
    {"prompt": "What is 2+2?", "chosen": "4.", "rejected": "5."},
    {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."},
]


@pytest.fixture(scope="module")
def tok():
    return byte_level_tokenizer()


def enc(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def write(tmp_path, name, rows):
    p = tmp_path / name
    if name.endswith(".jsonl"):
        p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif name.endswith(".json"):
        p.write_text(json.dumps(rows))
    else:
        pd.DataFrame(rows).to_parquet(p)
    return str(p)


@pytest.mark.parametrize("name", ["pairs.json", "pairs.jsonl", "pairs.parquet"])
def test_each_file_format(tmp_path, tok, name):
    ds = load_pairs(DataSpec(path=write(tmp_path, name, ROWS)), tok, max_length=128)
    assert len(ds) == 2
    p = ds.pairs[0]
    assert p.prompt_ids == tuple([tok.bos_token_id] + enc(tok, "What is 2+2?"))
    assert p.chosen_ids == tuple(enc(tok, "4.") + [tok.eos_token_id])
    assert p.rejected_ids == tuple(enc(tok, "5.") + [tok.eos_token_id])


def test_hf_dataset_from_local_dir(tmp_path, tok):
    """data.hf goes through datasets.load_dataset; a local folder of data files stands in for the hub."""
    d = tmp_path / "my_prefs"
    d.mkdir()
    write(d, "train.jsonl", ROWS)
    ds = load_pairs(DataSpec(hf=str(d), split="train"), tok, max_length=128)
    assert len(ds) == 2 and ds.pairs[1].chosen_ids[:-1] == tuple(enc(tok, "Blue."))


def test_implicit_prompt_from_shared_start(tmp_path, tok):
    rows = [{"chosen": "\n\nHuman: hi\n\nAssistant: Hello there!", "rejected": "\n\nHuman: hi\n\nAssistant: Go away."}]
    p = load_pairs(DataSpec(path=write(tmp_path, "hh.jsonl", rows)), tok, 128).pairs[0]
    assert p.prompt_ids[1:] == tuple(enc(tok, "\n\nHuman: hi\n\nAssistant: "))
    assert p.chosen_ids[:-1] == tuple(enc(tok, "Hello there!"))
    assert p.rejected_ids[:-1] == tuple(enc(tok, "Go away."))


def test_implicit_prompt_backs_off_to_a_word_boundary(tmp_path, tok):
    rows = [{"chosen": "Q: pick one. A: apples", "rejected": "Q: pick one. A: avocados"}]
    p = load_pairs(DataSpec(path=write(tmp_path, "w.jsonl", rows)), tok, 128).pairs[0]
    assert p.chosen_ids[:-1] == tuple(enc(tok, "apples"))


def test_column_mapping(tmp_path, tok):
    rows = [{"question": "q?", "good": "yes", "bad": "no"}]
    spec = DataSpec(path=write(tmp_path, "m.jsonl", rows),
                    columns={"prompt": "question", "chosen": "good", "rejected": "bad"})
    p = load_pairs(spec, tok, 64).pairs[0]
    assert p.chosen_ids[:-1] == tuple(enc(tok, "yes"))


CHAT = [{
    "chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "bye"}],
}]


def test_chat_messages_plain_rendering_without_template(tmp_path, tok):
    p = load_pairs(DataSpec(path=write(tmp_path, "c.json", CHAT)), tok, 128).pairs[0]
    assert p.prompt_ids == tuple(enc(tok, "<|user|>\nhi\n<|assistant|>\n"))
    assert p.chosen_ids == tuple(enc(tok, "hello\n"))
    assert p.rejected_ids == tuple(enc(tok, "bye\n"))


def test_chat_messages_with_the_tokenizers_template(tmp_path):
    tok = byte_level_tokenizer()
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}</s>{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    rows = [{"prompt": [{"role": "user", "content": "hi"}],
             "chosen": [{"role": "assistant", "content": "hello"}],
             "rejected": [{"role": "assistant", "content": "bye"}]}]
    p = load_pairs(DataSpec(path=write(tmp_path, "t.jsonl", rows)), tok, 128).pairs[0]
    assert p.prompt_ids == tuple(enc(tok, "[user]hi</s>[assistant]"))
    assert p.chosen_ids == tuple(enc(tok, "hello</s>"))
    assert render_messages([{"role": "user", "content": "x"}], tok, True) == "[user]x</s>[assistant]"


def test_truncation_cuts_prompt_left_then_responses_right():
    prompt, c, r = list(range(100, 120)), list(range(10)), list(range(20, 26))
    p2, c2, r2 = truncate_pair(prompt, c, r, max_length=20, min_prompt_tokens=4, min_response_tokens=2)
    assert p2 == list(range(110, 120)) and c2 == c and r2 == r  # prompt keeps its end
    p3, c3, r3 = truncate_pair(prompt, c, r, max_length=10, min_prompt_tokens=4, min_response_tokens=2)
    assert p3 == list(range(116, 120)) and c3 == c[:6] and r3 == r  # then responses lose their tail
    assert truncate_pair(prompt, c, r, max_length=5, min_prompt_tokens=4, min_response_tokens=2) is None
    assert truncate_pair(prompt[:3], c, r, max_length=100, min_prompt_tokens=4, min_response_tokens=2) == (prompt[:3], c, r)


def test_too_long_pairs_are_dropped_and_counted(tmp_path, tok):
    rows = ROWS + [{"prompt": "p", "chosen": "x" * 200, "rejected": "y"}]
    ds = load_pairs(DataSpec(path=write(tmp_path, "d.jsonl", rows), min_prompt_tokens=2, min_response_tokens=60),
                    tok, max_length=40)
    assert len(ds) == 2 and ds.dropped == 1


def test_synthetic_is_deterministic_and_sized(tok):
    spec = DataSpec(synthetic={"pairs": 5, "prompt_tokens": 7, "response_tokens": 4, "seed": 3})
    a, b = load_pairs(spec, tok, 64), load_pairs(spec, tok, 64)
    assert a == b and len(a) == 5
    assert len(a.pairs[0].prompt_ids) == 8 and len(a.pairs[0].chosen_ids) == 5  # + BOS, + EOS


def test_drop_last_and_whole_pairs_per_rank():
    assert usable_pairs(10, 4, 1, grad_acc=1) == 8 and usable_pairs(10, 2, 2, grad_acc=1) == 8
    assert usable_pairs(10, 2, 1, grad_acc=2) == 8 and usable_pairs(3, 4, 1, grad_acc=1) == 0
    it0 = micro_batch_order(10, 2, 2, rank=0, seed=0, grad_acc=1)
    it1 = micro_batch_order(10, 2, 2, rank=1, seed=0, grad_acc=1)
    epoch = [next(it0) + next(it1) for _ in range(2)]
    flat = [i for mb in epoch for i in mb]
    assert len(flat) == len(set(flat)) == 8  # no pair twice in an epoch, 2 left out (drop_last)


def step_pairs(n_pairs: int, micro_batch: int, grad_acc: int, world: int, steps: int) -> list[list[int]]:
    """The pairs of each optimizer step, over all ranks and micro-steps, in order."""
    ranks = [micro_batch_order(n_pairs, micro_batch, world, rank=r, seed=0, grad_acc=grad_acc)
             for r in range(world)]
    return [[i for _ in range(grad_acc) for it in ranks for i in next(it)] for _ in range(steps)]


@pytest.mark.parametrize("n_pairs", [10, 13, 16])
def test_every_split_of_an_effective_batch_sees_the_same_pairs_every_epoch(n_pairs):
    """Effective batch 8 as (micro_batch, grad_acc, workers); 6 steps run past the first epoch."""
    splits = [(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1), (4, 1, 2), (2, 2, 2), (1, 2, 4), (2, 1, 4)]
    want = step_pairs(n_pairs, *splits[0], steps=6)
    for split in splits[1:]:
        got = step_pairs(n_pairs, *split, steps=6)
        assert [sorted(s) for s in got] == [sorted(s) for s in want], split


# --- bad data: each case a DataError naming the file, the row or column, and the fix ----------
@pytest.mark.parametrize("name, rows, match", [
    ("empty.jsonl", [], r"empty\.jsonl: the file holds no pairs"),
    ("nocol.jsonl", [{"prompt": "a", "chosen": "b"}], r"nocol\.jsonl: line 1: column 'rejected' is missing \(columns found: chosen, prompt\); rename yours with data\.columns"),
    ("badtype.jsonl", [ROWS[0], {"prompt": "a", "chosen": 3, "rejected": "b"}], r"badtype\.jsonl: line 2: 'chosen' is int \(3\)"),
    ("noshared.jsonl", [{"chosen": "abc", "rejected": "xyz"}], r"noshared\.jsonl: line 1: there is no prompt column"),
    ("mixed.jsonl", [{"prompt": "p", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}], r"mixed\.jsonl: line 1: 'chosen' and 'rejected' must both be"),
])
def test_bad_data_errors(tmp_path, tok, name, rows, match):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DataError, match=match):
        load_pairs(DataSpec(path=str(path)), tok, 128)


def test_bad_files(tmp_path, tok):
    with pytest.raises(DataError, match="no such file"):
        load_pairs(DataSpec(path=str(tmp_path / "missing.jsonl")), tok, 128)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'; use \.json, \.jsonl or \.parquet"):
        load_pairs(DataSpec(path=str(tmp_path / "a.csv")), tok, 128)
    (tmp_path / "b.jsonl").write_text('{"chosen": "a", "rejected": "b", "prompt": "c"}\n{oops\n')
    with pytest.raises(DataError, match=r"b\.jsonl: line 2: not valid JSON"):
        load_pairs(DataSpec(path=str(tmp_path / "b.jsonl")), tok, 128)


def test_nothing_left_after_truncation(tmp_path, tok):
    rows = [{"prompt": "p" * 50, "chosen": "c" * 50, "rejected": "r" * 50}]
    with pytest.raises(DataError, match=r"no pair left after truncation to max_length=20 \(1 dropped.*raise train\.max_length"):
        load_pairs(DataSpec(path=write(tmp_path, "long.jsonl", rows)), tok, max_length=20)


def test_bad_data_through_the_cli_exits_2(tmp_path, capsys):
    from dpo_sweep.cli import main

    (tmp_path / "x.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b"}))
    space = tmp_path / "s.yaml"
    space.write_text(f"name: s\nmodel: {{preset: tiny-llama}}\ndata: {{path: {tmp_path / 'x.jsonl'}}}\n"
                     "train: {steps: 2, warmup_steps: 0, precision: fp32}\nresources: {use_gpu: false}\n")
    assert main(["trial", str(space), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "column 'rejected' is missing" in err and "Traceback" not in err


def test_truncation_keeps_the_bos_token(tok):
    spec = DataSpec(synthetic={"pairs": 2, "prompt_tokens": 40, "response_tokens": 10}, min_prompt_tokens=4)
    ds = load_pairs(spec, tok, max_length=30)
    p = ds.pairs[0]
    assert p.prompt_ids[0] == tok.bos_token_id and len(p.prompt_ids) + len(p.chosen_ids) == 30
    full = load_pairs(spec, tok, max_length=200).pairs[0]
    assert p.prompt_ids[1:] == full.prompt_ids[-(len(p.prompt_ids) - 1):]  # the prompt's end is kept


def test_a_warm_worker_tokenises_the_same_data_once_and_a_changed_file_again(tmp_path):
    # A warm worker's trials share the sweep's data: tokenising it again cost 0.2-0.4 s a trial
    # on the H200. What makes the pairs decides: another max_length, or the file rewritten.
    import os

    from dpo_sweep.train.warm_state import WarmState
    from testkit import make_cfg

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "chosen": "c", "rejected": "r"}) + "\n" for i in range(8)))
    cfg = make_cfg(data={"path": str(path)})
    tokenized_pairs = WarmState().tokenized_pairs  # one warm worker's
    tok, first = tokenized_pairs(cfg)
    # another trial of the sweep: other knobs, other precision, the same data
    assert tokenized_pairs(make_cfg(data={"path": str(path)}, micro_batch=2, precision="bf16-mixed"))[1] is first
    assert tokenized_pairs(make_cfg(data={"path": str(path)}, max_length=32))[1] is not first
    again = tokenized_pairs(cfg)[1]
    assert again is not first and again == first  # one data set at a time
    path.write_text(path.read_text() + json.dumps({"prompt": "p8", "chosen": "c", "rejected": "r"}) + "\n")
    os.utime(path, ns=(1, 1))
    assert len(tokenized_pairs(cfg)[1]) == 9
