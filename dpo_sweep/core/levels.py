"""The activation-checkpoint levels as values: each level carries what it recomputes (its regions
and the FLOPs it re-runs), its place in memory order and its marker in the report's plots.

A :class:`Level` is a ``str`` (``enum.StrEnum``): its value is the level's spelling in space
files, results.csv and the console (``none``, ``L1``, ``L2``, ``L3``, ``full``), so it equals
the string read back from a CSV cell, and ``Level(cell)`` gives its facts. The members are in
config.CHECKPOINT_LEVELS' order (tests/test_levels.py checks it). Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

from dpo_sweep.core.status import TextEnum


@dataclass(frozen=True)
class LevelRegions:
    """What a checkpoint level recomputes in one decoder layer's backward (train/checkpointing.py
    wraps these regions; plan/memory.py counts the tensors they do not keep)."""

    mlp: bool  # the MLP sub-block is a region
    attention: bool  # the attention projections are a region (the kernel's outputs kept)
    qkv: bool  # q, k and v projections are regions of their own inside it
    layer: bool  # the whole decoder layer is one region


class Level(TextEnum):
    """A checkpoint level, from most activations kept (``none``) to fewest (``full``)."""

    regions: LevelRegions
    #: The parts of core/flops.py's ForwardFlops the level re-runs in backward. Non-reentrant
    #: checkpointing stops once every tensor backward needs is back, so a region's last matmul
    #: (the MLP's ``down``, the attention's ``o``) is never re-run; L2 and L3 keep the attention
    #: kernel's outputs, so its scores are not re-run; L3's nested q/k/v regions re-run what L2
    #: already does.
    recomputed: tuple[str, ...]
    #: The marker of its points in the report's scatter plots, the same in every report.
    symbol: str

    NONE = "none", LevelRegions(mlp=False, attention=False, qkv=False, layer=False), (), "circle"
    L1 = "L1", LevelRegions(mlp=True, attention=False, qkv=False, layer=False), ("mlp_in",), "square"
    L2 = "L2", LevelRegions(mlp=True, attention=True, qkv=False, layer=False), ("mlp_in", "qkv"), "diamond"
    L3 = "L3", LevelRegions(mlp=True, attention=True, qkv=True, layer=False), ("mlp_in", "qkv"), "triangle-up"
    FULL = ("full", LevelRegions(mlp=False, attention=False, qkv=False, layer=True),
            ("qkv", "o_proj", "attention", "mlp_in"), "hexagon")

    def __new__(cls, value: str, regions: LevelRegions, recomputed: tuple[str, ...], symbol: str) -> Level:
        member = str.__new__(cls, value)
        member._value_ = value
        member.regions, member.recomputed, member.symbol = regions, recomputed, symbol
        return member

    @property
    def memory_rank(self) -> int:
        """Its place from most activations kept (``none``: 0) to fewest (``full``): none > L1 > L2
        >= L3 > full. The planner prunes after an OOM by it and the tables list levels in it."""
        return list(Level).index(self)

    @property
    def strength(self) -> int:
        """How strongly it checkpoints (``full``: 0, ``none``: the most): the reverse of
        :attr:`memory_rank`, for orders that put the smallest memory first."""
        return len(Level) - 1 - self.memory_rank

    @property
    def trl_level(self) -> Level:
        """The level a TRL ``DPOConfig`` runs for it: TRL's ``gradient_checkpointing`` checkpoints
        whole decoder layers or nothing, so a selective level becomes ``full`` (the nearest: more
        recompute, less memory)."""
        return self if self in (Level.NONE, Level.FULL) else Level.FULL


#: Levels that are refused at validation, with the reason shown to the user (not members of Level).
REFUSED_LEVELS: dict[str, str] = {
    "L4": (
        "L4 is refused: checkpointing inside RMSNorm/LayerNorm or softmax splits a numerically "
        "sensitive reduction across the recompute boundary and saves almost nothing (the norm's "
        "input is kept anyway); use L3 or full instead"
    ),
}
