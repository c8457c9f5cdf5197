"""dpo_sweep/core/levels.py: each checkpoint level as one value carrying its facts; its value is the
level's spelling, so it equals the text of a config field or a CSV cell."""
import csv
import io
import json
import subprocess
import sys

import pytest

from dpo_sweep.config import CHECKPOINT_LEVELS
from dpo_sweep.core.flops import DecoderShape, TokenCounts, forward_flops, recompute_flops
from dpo_sweep.core.levels import Level


def test_the_levels_are_the_configs_in_memory_order():
    assert tuple(Level) == CHECKPOINT_LEVELS
    assert [lv.memory_rank for lv in Level] == [0, 1, 2, 3, 4]
    assert [lv.strength for lv in Level] == [4, 3, 2, 1, 0]  # full checkpoints the most


def test_a_level_is_its_string_everywhere_it_is_written():
    assert Level("L2") is Level.L2 and Level.L2 == "L2" and {"L2": 1}[Level.L2] == 1
    assert str(Level.FULL) == f"{Level.FULL}" == "full"
    assert json.dumps({"level": Level.NONE}) == '{"level": "none"}'
    buf = io.StringIO()
    csv.writer(buf).writerow([Level.L3, Level.NONE])
    assert buf.getvalue() == "L3,none\r\n"


def test_of_gives_the_level_of_a_cell_and_none_for_any_other_value():
    assert Level.of("L1") is Level.L1
    assert Level.of("L4") is None and Level.of("") is None and Level.of(float("nan")) is None
    with pytest.raises(ValueError):
        Level("L4")


def test_regions():
    r = {lv: lv.regions for lv in Level}
    assert not any(vars(r[Level.NONE]).values()) and r[Level.FULL].layer and not r[Level.FULL].mlp
    assert r[Level.L1].mlp and not r[Level.L1].attention
    assert r[Level.L2].attention and not r[Level.L2].qkv and r[Level.L3].qkv and r[Level.L3].mlp
    assert not any(r[lv].layer for lv in (Level.NONE, Level.L1, Level.L2, Level.L3))


def test_recomputed_parts_are_what_the_flops_count_re_runs():
    fwd = forward_flops(DecoderShape(64, 256, 4, 2, 16, 2, 100), TokenCounts(10, 55, 8))
    assert recompute_flops(fwd, "none", lean_mlp=False) == 0
    assert recompute_flops(fwd, "L1", lean_mlp=False) == fwd.mlp_in
    assert recompute_flops(fwd, Level.L1, lean_mlp=True) == fwd.mlp_in + fwd.mlp_down
    assert recompute_flops(fwd, "L2", lean_mlp=False) == recompute_flops(fwd, "L3", lean_mlp=False) == fwd.mlp_in + fwd.qkv
    assert recompute_flops(fwd, "full", lean_mlp=False) == fwd.qkv + fwd.o_proj + fwd.attention + fwd.mlp_in
    with pytest.raises(ValueError, match="checkpoint level 'L4'; allowed: none, L1, L2, L3, full"):
        recompute_flops(fwd, "L4", lean_mlp=False)


def test_each_level_has_its_own_plot_symbol():
    assert [lv.symbol for lv in Level] == ["circle", "square", "diamond", "triangle-up", "hexagon"]


def test_it_imports_without_torch_or_the_config():
    code = "import sys; import dpo_sweep.core.levels; print('torch' in sys.modules, 'dpo_sweep.config' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_trl_runs_a_selective_level_as_full():
    assert [lv.trl_level for lv in Level] == [Level.NONE, Level.FULL, Level.FULL, Level.FULL, Level.FULL]
