"""preflight.check_files: what ``run`` refuses before Ray starts - the output folder, a checkpoint
folder's files, a data file's rows - without importing a tokenizer or torch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpo_sweep import preflight
from dpo_sweep.errors import UserError
from testkit import make_cfg

REPO = Path(__file__).resolve().parents[1]


def test_each_kind_of_file_mistake_is_refused(tmp_path):
    out_file = tmp_path / "taken"
    out_file.write_text("")
    with pytest.raises(UserError, match="taken"):
        preflight.check_files([make_cfg()], out_file)
    half = tmp_path / "ckpt"
    half.mkdir()
    (half / "config.json").write_text("{}")
    with pytest.raises(UserError, match="the folder lacks"):
        preflight.check_files([make_cfg(model={"name_or_path": str(half)})])
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "chosen": "c", "rejected": "r"}) + "\n{not json\n")
    with pytest.raises(UserError, match="line 2"):
        preflight.check_files([make_cfg(data={"path": str(bad)})])


def test_it_imports_no_tokenizer_and_no_torch(tmp_path):
    # As ``run`` does it: the space loaded, its trials' files checked, in a fresh process.
    good = tmp_path / "pairs.jsonl"
    good.write_text(json.dumps({"prompt": "p", "chosen": "c", "rejected": "r"}) + "\n")
    space = tmp_path / "space.yaml"
    space.write_text(f"name: files\nmodel: {{preset: tiny-llama}}\ndata: {{path: {good}}}\n"
                     "search: {micro_batch: [1, 2]}\n")
    script = ("import sys\nfrom dpo_sweep import preflight, space\n"
              f"preflight.check_files(space.load({str(space)!r}).trials, None)\n"
              "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_bad_row_or_column_is_refused_by_the_file_checks_as_by_the_full_read(tmp_path):
    # The same message as when the rows are tokenised (train/data.py), found without a tokenizer.
    from dpo_sweep.train.data import load_pairs
    from dpo_sweep.train.tokenizer import load_tokenizer

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "p", "chosen": "c", "rejected": "r"}) + "\n"
                    + json.dumps({"prompt": "p", "chosen": 3, "rejected": "r"}) + "\n")
    cols = tmp_path / "cols.jsonl"
    cols.write_text(json.dumps({"prompt": "p", "good": "c", "rejected": "r"}) + "\n")
    for path, match in ((rows, "line 2: 'chosen' is int"), (cols, "column 'chosen' is missing")):
        cfg = make_cfg(data={"path": str(path)})
        with pytest.raises(UserError, match=match) as quick:
            preflight.check_files([cfg])
        with pytest.raises(UserError) as full:
            load_pairs(cfg.data, load_tokenizer(cfg.model), cfg.train.max_length)
        assert str(quick.value) == str(full.value)


def test_the_full_preflight_reads_a_data_file_once(tmp_path, monkeypatch):
    # run: check_files before Ray, check_inputs beside it, from the rows check_files read.
    from dpo_sweep.train import sources

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "chosen": "c", "rejected": "r"}) + "\n" for i in range(8)))
    trials = (make_cfg(data={"path": str(path)}), make_cfg(data={"path": str(path)}, micro_batch=2))
    before = preflight.check_inputs(trials)
    reads = []
    real = sources.read_file

    def counted(p):
        reads.append(p)
        return real(p)

    monkeypatch.setattr(sources, "read_file", counted)
    monkeypatch.setattr(preflight, "read_file", counted)
    files = preflight.check_files(trials, tmp_path / "out")
    after = preflight.check_inputs(trials, tmp_path / "out", files)
    assert len(reads) == 1
    assert [(s.pairs, s.lengths) for s in after] == [(s.pairs, s.lengths) for s in before]
