"""benchmarks/architectures.py: its smoke mode sweeps tiny folders through the product and writes
architectures.csv in the issue's columns; its real architectures' configurations are all ones their
families accept (the GPU run meets no refusal) and have a prediction."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import architectures  # noqa: E402

from dpo_sweep import space as space_mod  # noqa: E402


def test_smoke_mode_writes_the_architectures_csv(tmp_path, capsys):
    assert architectures.main(["--smoke", "--only", "tiny-qwen3-moe", "--out", str(tmp_path / "out"),
                               "--work", str(tmp_path / "work")]) == 0
    with (tmp_path / "out" / "architectures.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[:5] == ["model_type", "trial_id", "status", "peak_mem_gb", "predicted_peak_gb"]
    assert [(r["model_type"], r["checkpoint_level"], r["status"]) for r in rows] == [
        ("qwen3_moe", "none", "ok"), ("qwen3_moe", "L1", "ok")]
    assert all(float(r["peak_mem_gb"]) > 0 and float(r["predicted_peak_gb"]) >= 0 for r in rows)
    assert "ok rows predicted within 5%" in capsys.readouterr().out
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "python benchmarks/architectures.py --smoke --only tiny-qwen3-moe" in readme and "**Machine:**" in readme


def test_the_checkpoint_is_built_outside_the_process_that_starts_the_sweep(tmp_path):
    # The sampler reads the whole GPU's memory: a model this process built would stay cached in
    # its allocator and count in every trial's peak. Run in a fresh interpreter so that no other
    # test has imported the family's modeling code already; the sweep's own command is stubbed.
    code = f"""
import sys
sys.path[:0] = [{str(REPO)!r}, {str(REPO / "benchmarks")!r}]
import architectures
architectures.subprocess.run = lambda *a, **k: None
arch = next(a for a in architectures.SMOKE if a.label == "tiny-qwen3-moe")
architectures.sweep(arch, __import__("pathlib").Path({str(tmp_path)!r}), smoke=True)
print("modeling imported here:", "transformers.models.qwen3_moe.modeling_qwen3_moe" in sys.modules)
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "modeling imported here: False" in out.stdout
    assert (tmp_path / "tiny-qwen3-moe" / "ckpt" / "config.json").is_file()


@pytest.mark.parametrize("arch", architectures.ARCHS, ids=lambda a: a.label)
def test_every_real_configuration_is_accepted_by_its_family(arch, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from dpo_sweep.models.family import family_of
    from dpo_sweep.core.trial_facts import refused_attention

    raw = __import__("yaml").safe_load(architectures.space_text(arch, tmp_path / "ckpt", smoke=False))
    trials = space_mod.parse(raw).trials
    assert len(trials) == len(arch.micro_batch) * len(arch.levels)
    cfg = AutoConfig.for_model(arch.model_type, **arch.config)
    with torch.device("meta"):
        fam = family_of(AutoModelForCausalLM.from_config(cfg))
    assert fam.refused() is None
    for t in trials:
        assert fam.refused_level(t.checkpoint_level) is None
        assert refused_attention(t.checkpoint_level, arch.attn) is None
    # The planner's prediction from the folder's config alone (no weights needed for it).
    from dpo_sweep.plan.memory import predict_peak_gb

    cfg.save_pretrained(tmp_path / "ckpt")
    peaks = [predict_peak_gb(t, device="cuda").total_gb for t in trials]
    assert all(2 < p < 140 for p in peaks), peaks
