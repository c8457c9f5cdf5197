"""benchmarks/trainer_h200.py: the plumbing, in its tiny CPU mode (the H200 numbers need the GPU)."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import h200_common as common  # noqa: E402
import trainer_h200  # noqa: E402


def run_bench(script: str, args: list[str], out: Path, csv_name: str, timeout: int) -> list[dict[str, str]]:
    """Run a benchmark script in its tiny CPU mode; return its CSV rows (header checked)."""
    proc = subprocess.run([sys.executable, str(BENCH / script), "--preset-scale", "tiny", *args, "--out-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with (out / csv_name).open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        assert reader.fieldnames == common.CSV_COLUMNS
    return rows


def test_every_h200_space_is_valid_and_exactly_1024_tokens(tmp_path):
    from dpo_sweep import space as space_mod
    from dpo_sweep.train.data import load_pairs
    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    scale = common.SCALES["h200"]
    for cfg in common.CONFIGS:
        path = tmp_path / f"{cfg.name}.yaml"
        path.write_text(trainer_h200.space_yaml(cfg, scale))
        trial = space_mod.load(str(path), []).trials[0]
        assert (trial.micro_batch, trial.checkpoint_level, trial.grad_acc) == (cfg.micro_batch, cfg.checkpoint_level, 1)
        assert trial.model.preset == cfg.preset and trial.model.liger_kernel == cfg.liger_kernel
        assert trial.model.attn_implementation == "sdpa"
        t = trial.train
        assert (t.precision, t.reference, t.logp_chunk_tokens) == ("bf16", cfg.reference, cfg.logp_chunk_tokens)
        assert (t.steps, t.warmup_steps, t.max_length, t.lr, trial.beta) == (8, 3, 1024, 5e-6, 0.1)
        assert trial.data.synthetic.pairs == 8 * cfg.micro_batch
    ds = load_pairs(trial.data, byte_level_tokenizer(), trial.train.max_length)
    pair = ds.pairs[0]
    assert ds.truncated == 0 and ds.dropped == 0
    assert (len(pair.prompt_ids), len(pair.chosen_ids), len(pair.rejected_ids)) == (512, 512, 512)


def test_unknown_config_name_is_refused_with_the_choices():
    with pytest.raises(SystemExit, match="choose from: 1b-mb8-none"):
        common.select_configs("1b-mb8-none,nope")
    assert [c.name for c in common.select_configs("8b-mb4-none,1b-mb8-none")] == ["1b-mb8-none", "8b-mb4-none"]


def test_ratios_convert_gib_to_gb():
    ours = [{"config": "1b-mb8-none", "status": "ok", "peak_mem_gb": str(40.3 * 2**30 / 1e9 * 0.5),
             "tokens_per_s": "43400", "step_time_ms": "378", "torch_peak_alloc_gb": "10"}]
    row = trainer_h200.comparison_rows(ours, [])[0]
    assert row["mem_x_ref"] == pytest.approx(0.5)
    assert row["tok_x_ref"] == pytest.approx(1.0)
    assert "peak <= 0.70x: PASS" in row["goal"] and "tok/s >= 1.05x: FAIL" in row["goal"]


def test_tiny_mode_writes_csv_and_markdown(tmp_path):
    out = tmp_path / "results"
    rows = run_bench("trainer_h200.py", ["--jobs", "2", "--configs", "1b-mb8-none,1b-mb8-L1", "--max-minutes", "2"],
                     out, "trainer_h200.csv", timeout=120)
    assert sorted(r["config"] for r in rows) == ["1b-mb8-L1", "1b-mb8-none"]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["scale"] == "tiny" and r["seq_len"] == "32" and r["trainer"] == "dpo-sweep"
        assert float(r["step_time_ms"]) > 0 and float(r["tokens_per_s"]) > 0 and float(r["peak_mem_gb"]) > 0
    md = (out / "trainer_h200.md").read_text()
    for header in ("| config | status | step ms | tokens/s | NVML peak GiB | NVML peak GB | torch alloc GB",
                   "TRL ref (ms / tok/s / GiB)", "peak x TRL ref", "tok/s x TRL ref", "goal",
                   "Which lever bought what", "| 1b-mb8-L1 | checkpoint L1 | 1b-mb8-none |", "--preset-scale tiny"):
        assert header in md, header
    assert "TRL here" not in md  # no trl_h200.csv: the measured-TRL column is left out


def test_trl_text_tokenizes_to_exact_lengths():
    from dpo_sweep.train.tokenizer import byte_level_tokenizer
    from trl_dpo_h200 import synthetic_text

    tok = byte_level_tokenizer()
    data = synthetic_text(2, 511, 511, tok.bos_token)
    prompt = tok(data["prompt"][0])["input_ids"]
    chosen = tok(data["chosen"][0] + tok.eos_token)["input_ids"]
    assert prompt[0] == tok.bos_token_id and len(prompt) == 512
    assert len(chosen) == 512 and chosen[-1] == tok.eos_token_id


@pytest.mark.slow
def test_trl_tiny_mode_writes_joinable_csv(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path / "results"
    rows = run_bench("trl_dpo_h200.py", ["--configs", "1b-mb8-full"], out, "trl_h200.csv", timeout=180)
    assert [(r["config"], r["trainer"], r["status"], r["checkpoint_level"]) for r in rows] == [
        ("1b-mb8-full", "trl", "ok", "full")], rows[0]["error"]
    assert int(rows[0]["measured_steps"]) == 1 and float(rows[0]["tokens_per_s"]) > 0


def test_a_child_without_a_result_is_timeout_or_error_with_its_last_error_line():
    killed = common.ProcResult(returncode=124, wall_s=60.0, timed_out=True, output_tail="step 3\n")
    assert common.child_failure(killed, 59.6) == {"status": "timeout", "error": "killed after 60 s (timeout)"}
    crashed = common.ProcResult(1, 2.0, False, "loading\nRuntimeError: CUDA error: out of memory\nbye\n")
    assert common.child_failure(crashed, 60) == {
        "status": "error", "error": "exit 1: RuntimeError: CUDA error: out of memory"}
    assert common.command_line(["--configs", "a b"]).endswith(" --configs 'a b'")
