"""The per-dimension effect table: the median change in peak GB and tokens/s against a dimension's
first value, over trials that differ in that dimension alone (a micro_batch at one effective batch)."""
from __future__ import annotations

from dataclasses import replace

from sweep_frames import frame, trial

from dpo_sweep.analysis.effects import effect_rows, effects, unpaired


def grid(tmp_path):
    """micro_batch 1/2 x checkpoint none/L1 at effective batch 8 (grad_acc follows micro_batch), one OOM."""
    rows = []
    for mb, ga in ((1, 8), (2, 4)):
        for level, saved in (("none", 0.0), ("L1", 3.0)):
            mem = 10.0 + 4.0 * mb - saved  # micro_batch 2: +4 GB; L1: -3 GB
            tps = 1000.0 * (1.5 if mb == 2 else 1.0) * (0.8 if level == "L1" else 1.0)
            rows.append(trial(f"t{mb}{level}", mem, 100.0, 0.02, tps=tps, mb=mb, ga=ga, level=level, seed=0))
    rows.append(trial("oom", status="oom", mb=4, ga=2, level="none", seed=0))
    return frame(tmp_path, rows)


def test_effects_hold_the_rest_fixed(tmp_path):
    items = effects(grid(tmp_path))
    by = {(e.dimension, e.value): e for e in items}
    mb = by[("micro_batch", "2")]
    assert (mb.base, mb.pairs, mb.peak_gb, round(mb.tokens_pct, 6)) == ("1", 2, 4.0, 50.0)
    assert by[("micro_batch", "4")].pairs == 0  # only an OOM: nothing measured
    level = by[("checkpoint_level", "L1")]
    assert (level.base, level.pairs, level.peak_gb, round(level.tokens_pct, 6)) == ("none", 2, -3.0, -20.0)
    assert unpaired(items) == ["grad_acc"]  # it follows micro_batch at one effective batch
    rows = effect_rows(items)
    assert ["micro_batch", "2", "1", "2", "+4.00", "+50.0%"] in rows
    assert ["checkpoint_level", "L1", "none", "2", "-3.00", "-20.0%"] in rows
    assert not any(r[0] == "grad_acc" for r in rows)


def test_a_lever_is_paired_across_the_same_configuration(tmp_path):
    rows = [replace(trial(f"{a}{mb}", 40.0 if a == "full" else 20.0 + mb, 100.0, 0.02, mb=mb, seed=0), adapter=a)
            for a in ("full", "lora") for mb in (1, 2)]
    by = {(e.dimension, e.value): e for e in effects(frame(tmp_path, rows))}
    assert by[("adapter", "lora")].pairs == 2 and by[("adapter", "lora")].peak_gb == -18.5
