"""The parity check: the trainer's fast paths against the model's own forward, on one tiny batch.

What a configuration runs beyond the model's own ``forward().logits`` - the log-prob head with
the family's head transform (chunked or plain), its checkpoint level, lean ops, padding-free
packing - is compared with that forward's float32 log-softmax and plain autograd on
:func:`parity_pairs` (two short ragged pairs). Two figures (:class:`ParityFigures`): the largest
difference of a sequence's summed response log-prob (nats; ``logp_parity`` in results.csv) and
the relative difference of the gradient of a weighted sum of them with respect to the input
embeddings' output - a gradient that flows back through every layer, so a region that backward
recomputes differently (a checkpointed layer whose recompute takes another path) shows in it,
while no weight gradient is allocated.

Where it runs: ``validate``, ``run`` and ``trial`` check every model small enough for the CPU
(:data:`CPU_PARAMS`) there, in float32, each distinct setting of the trials alone and then
together (:func:`check_on_cpu`: a mismatch is a UserError, exit 2, naming the setting); and every
trial checks its own model, in its own precision on its own device, before its first step
(:func:`expected` before the fast paths are applied, :func:`compare` after: a mismatch is the
trial's ``error`` status, naming model type, setting and difference).
"""
from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn

from dpo_sweep.errors import UserError
from dpo_sweep.train.batching import MicroBatch, collate, pack
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.logprobs import SequenceLogProbs

if TYPE_CHECKING:
    from dpo_sweep.config import ModelSpec, TrialConfig

#: Models of at most this many parameters are checked at validate, in float32 on the CPU (a 150M
#: model's copy is 0.6 GB there); larger ones only inside their trials.
CPU_PARAMS = 150_000_000
#: (log-prob difference in nats per sequence beyond :attr:`Expected.rounding`, relative gradient
#: difference) allowed, by whether the maths runs in float32 or a 16-bit type. On the CPU, over 18
#: families' tiny checkpoints with the head x200: float32 paths 0 to 1.2e-4 nats and <0.01% apart; bf16
#: and bf16-mixed (6 families, full + lean ops + chunked head) 0 to 6e-5 nats apart, Gemma-2 at x200
#: 0.17 (its own forward soft-caps bf16 logits: within their rounding), gradients 0 to 0.9% apart. A
#: dropped head transform or a layer computed otherwise differs by tenths of a nat to nats (SmolLM3's
#: NoPE layer under L2: 0.66 nats in float32).
TOLERANCE = {"fp32": (1e-3, 1e-3), "half": (0.1, 0.1)}


class ParityError(RuntimeError):
    """A trial's fast paths disagree with its model's own forward (the trial's ``error`` status)."""


@dataclass(frozen=True)
class FastPaths:
    """The settings of a configuration that change how log-probs and gradients are computed."""

    chunk_tokens: int  # train.logp_chunk_tokens (0: the plain head)
    level: str  # checkpoint_level
    lean_ops: bool  # model.lean_ops
    padding_free: bool  # train.padding_free

    @classmethod
    def of(cls, cfg: TrialConfig) -> FastPaths:
        return cls(cfg.train.logp_chunk_tokens, cfg.checkpoint_level, cfg.model.lean_ops, cfg.train.padding_free)

    def describe(self) -> str:
        parts = [f"checkpoint_level {self.level}",
                 f"train.logp_chunk_tokens {self.chunk_tokens}" if self.chunk_tokens else "the plain head"]
        return ", ".join(parts + ["model.lean_ops"] * self.lean_ops + ["train.padding_free"] * self.padding_free)

    def alone(self) -> list[tuple[str, str, FastPaths]]:
        """(setting, fix, paths) for the plain path and each setting of this configuration beyond
        it on its own: the check names the one at fault and how to leave it out."""
        plain = FastPaths(0, "none", False, False)
        options = [
            (f"train.logp_chunk_tokens {self.chunk_tokens} (the chunked head)", "use logp_chunk_tokens 0",
             FastPaths(self.chunk_tokens, "none", False, False), self.chunk_tokens > 0),
            (f"checkpoint_level {self.level}", "use checkpoint_level none or full",
             FastPaths(0, self.level, False, False), self.level != "none"),
            ("model.lean_ops: true", "use lean_ops: false", FastPaths(0, "none", True, False), self.lean_ops),
            ("train.padding_free: true", "use padding_free: false", FastPaths(0, "none", False, True),
             self.padding_free),
        ]
        return [("the log-prob head", "this model's head is not one the trainer reproduces (a transform after "
                 "its lm_head that dpo_sweep/train/head.py does not know); it cannot be trained here", plain)] + [
            (name, fix, paths) for name, fix, paths, used in options if used]


@dataclass(frozen=True)
class ParityFigures:
    logp_diff: float  # largest |trainer - own forward| of a sequence's summed log-prob, nats
    grad_diff: float  # ||g_trainer - g_own|| / ||g_own||, g: d(weighted log-probs)/d(input embeddings)
    logp_excess: float  # largest |difference| less the rounding of the own logits (Expected.rounding)

    def within(self, tolerance: tuple[float, float]) -> bool:
        return self.logp_excess <= tolerance[0] and self.grad_diff <= tolerance[1]

    def words(self) -> str:
        return f"log-probs {self.logp_diff:.3g} nats apart, input gradient {self.grad_diff:.1%} apart"


@dataclass(frozen=True)
class Expected:
    """The model's own forward on the parity batch: per sequence log-probs, the input gradient."""

    logps: torch.Tensor
    grad: torch.Tensor  # [real tokens, H], in the order of pack()
    #: per sequence, what rounding the model's own logits to their dtype can move its log-prob:
    #: twice the dtype's epsilon x the largest |logit| of each response token's row, summed. The
    #: trainer's head keeps float32 logits; a bf16 forward (Gemma-2 soft-capping in bf16 at x200
    #: logits: 0.17 nats on the CPU) rounds its own. Zero for the trainer's side.
    rounding: torch.Tensor


def parity_pairs(vocab_size: int) -> list[TokenizedPair]:
    """Two short pairs of fixed token ids below ``vocab_size`` (and below 256, any tokenizer's
    bytes), of different lengths so that the padded batch has padding."""
    rng = random.Random(0)
    top = max(2, min(vocab_size, 256))

    def ids(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, top) for _ in range(k))

    return [TokenizedPair(ids(7), ids(5), ids(3)), TokenizedPair(ids(4), ids(4), ids(6))]


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """Per-sequence weights of the scalar whose gradient is compared (a DPO-like signed mix)."""
    return torch.linspace(1.0, -1.0, n, device=device) + 0.25


@contextmanager
def _input_leaf(lm: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The input embeddings' output, made a leaf that requires grad, collected per forward."""
    leaves: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        leaf = output.detach().requires_grad_()
        leaves.append(leaf)
        return leaf

    handle = lm.get_input_embeddings().register_forward_hook(hook)
    try:
        yield leaves
    finally:
        handle.remove()


def _real_tokens(grad: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """The rows of an input gradient at real (unpadded) tokens, in pack()'s order, float32."""
    return grad[batch.attention_mask.to(grad.device).bool()].float()


def _padded(pairs: list[TokenizedPair], pad_id: int, device: torch.device, side: str = "right") -> MicroBatch:
    return collate(pairs, list(range(len(pairs))), pad_id, padding_side=side).to(device)


def expected(lm: nn.Module, pairs: list[TokenizedPair], pad_id: int = 0) -> Expected:
    """The model's own ``forward().logits``: float32 log-softmax of the response tokens summed per
    sequence, and plain autograd's input gradient of their weighted sum."""
    device = lm.get_input_embeddings().weight.device
    batch = _padded(pairs, pad_id, device)
    with _input_leaf(lm) as leaves:
        logits = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False).logits
    token = logits[:, :-1].float().log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    logps = (token * batch.response_mask[:, 1:]).sum(-1)
    (grad,) = torch.autograd.grad((logps * _weights(len(logps), device)).sum(), leaves)
    largest = logits[:, :-1].detach().float().abs().amax(-1)
    rounding = 2 * torch.finfo(logits.dtype).eps * (largest * batch.response_mask[:, 1:]).sum(-1)
    return Expected(logps.detach().float(), _real_tokens(grad, batch), rounding)


def measured(logps_module: SequenceLogProbs, pairs: list[TokenizedPair], padding_free: bool,
             pad_id: int = 0, padding_side: str = "right") -> Expected:
    """The trainer's path (``logps_module`` over a model with its fast paths applied), the same
    figures, on the batch as the trial makes it (packed, or padded on ``padding_side``)."""
    lm = logps_module.lm
    device = lm.get_input_embeddings().weight.device
    batch = (pack(pairs, list(range(len(pairs)))).to(device) if padding_free
             else _padded(pairs, pad_id, device, padding_side))
    has_padding = bool((batch.attention_mask == 0).any())
    with _input_leaf(lm) as leaves:
        logps, _ = logps_module(batch.input_ids, batch.attention_mask if has_padding else None,
                                batch.position_ids, batch.response_mask, batch.sequence_ids)
    (grad,) = torch.autograd.grad((logps * _weights(len(logps), device)).sum(), leaves)
    return Expected(logps.detach().float(), _real_tokens(grad, batch), torch.zeros_like(logps.detach()))


def compare(want: Expected, got: Expected) -> ParityFigures:
    diff = (got.logps - want.logps).abs()
    excess = diff - want.rounding
    grad = float((got.grad - want.grad).norm() / want.grad.norm().clamp_min(1e-30))
    return ParityFigures(float(diff.max()), grad, float(excess.max()))


def tolerance(lm: nn.Module, autocast: bool) -> tuple[float, float]:
    """:data:`TOLERANCE` for ``lm``'s weights and autocast (16-bit maths: the half tolerance)."""
    half = autocast or next(lm.parameters()).dtype in (torch.bfloat16, torch.float16)
    return TOLERANCE["half" if half else "fp32"]


def refusal(model_type: str, setting: str, figures: ParityFigures, tol: tuple[float, float]) -> str:
    return (f"{model_type}: {setting} disagrees with the model's own forward on the parity batch: "
            f"{figures.words()} (allowed {tol[0]:g} nats beyond the rounding of its logits, {tol[1]:.1%})")


@contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """``model`` in training mode with every dropout off for the check, as it was afterwards."""
    from dpo_sweep.train.model import disable_dropout

    changed = disable_dropout(model)
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)
        for owner, key, value in changed:
            setattr(owner, key, value)


# --- the check at validate: small models, float32, on the CPU -------------------------------------


def apply_paths(lm: nn.Module, paths: FastPaths) -> SequenceLogProbs:
    """``lm`` with ``paths``' lean ops and checkpoint level applied in place (the trainer's order:
    train/setup.py), wrapped in the log-prob head as the policy's (its router loss included: a
    config that asks for one the family's code cannot add is refused here, not in the trial)."""
    from dpo_sweep.train.checkpointing import apply_checkpoint_level
    from dpo_sweep.train.lean import apply_lean_ops

    if paths.lean_ops:
        apply_lean_ops(lm)
    apply_checkpoint_level(lm, paths.level)
    return SequenceLogProbs(lm, paths.chunk_tokens, router_aux_loss=True)


def cpu_params(spec: ModelSpec) -> int:
    """``spec``'s parameter count, from its config on the meta device (no weights read)."""
    from transformers import AutoModelForCausalLM

    from dpo_sweep.models.presets import PRESETS, preset_config
    from dpo_sweep.models.pretrained import load_config

    cfg = preset_config(spec.preset) if spec.preset in PRESETS else load_config(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=spec.trust_remote_code)
    return sum(p.numel() for p in model.parameters())


def check_on_cpu(spec: ModelSpec, settings: set[FastPaths]) -> dict[FastPaths, ParityFigures]:
    """Each of ``settings`` on ``spec``'s model in float32 on the CPU against the model's own forward
    (where one disagrees, each of its settings alone too, to name the one at fault). UserError
    (exit 2) on a mismatch, or where a setting cannot be applied to this model."""
    from dpo_sweep.train.model import build_model

    # flash_attention_2 runs on CUDA only: auto's choice on the CPU stands in for it here.
    attn = "auto" if spec.attn_implementation == "flash_attention_2" else spec.attn_implementation
    lm = build_model(spec.model_copy(update={"dtype": "float32", "attn_implementation": attn}), "fp32",
                     torch.device("cpu"), seed=0).model
    model_type = getattr(lm.config, "model_type", type(lm).__name__)
    tol = TOLERANCE["fp32"]
    pairs = parity_pairs(lm.get_input_embeddings().weight.shape[0])
    with dropout_off(lm):
        want = expected(lm, pairs)
    done: dict[FastPaths, ParityFigures | Exception] = {}

    def run(paths: FastPaths) -> ParityFigures | Exception:
        if paths not in done:
            model = copy.deepcopy(lm)
            try:
                module = apply_paths(model, paths)
                with dropout_off(model):
                    done[paths] = compare(want, measured(module, pairs, paths.padding_free))
            except Exception as err:  # noqa: BLE001 - a path that cannot run on this model is refused
                done[paths] = err
        return done[paths]

    def refuse(name: str, fix: str, outcome: ParityFigures | Exception) -> UserError:
        if isinstance(outcome, Exception):
            return UserError(f"model {spec.label()}: {model_type}: {name} cannot run on this model "
                             f"({type(outcome).__name__}: {outcome}); refused before any training: {fix}")
        return UserError(f"model {spec.label()}: {refusal(model_type, name, outcome, tol)}; refused before any "
                         f"training: {fix}")

    def bad(outcome: ParityFigures | Exception) -> bool:
        return isinstance(outcome, Exception) or not outcome.within(tol)

    for paths in sorted(settings, key=repr):
        if not bad(run(paths)):
            continue
        # Which setting: each alone (the plain head first), else their combination.
        for name, fix, alone in paths.alone():
            if bad(run(alone)):
                raise refuse(name, fix, done[alone])
        raise refuse(paths.describe(), "use fewer of these settings together", done[paths])
    return {paths: done[paths] for paths in settings}


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one CPU thread: on a batch this small, more threads only wait on each other (on a
    busy machine of few cores, many times longer: benchmarks/README.md#trial-costs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_trials(trials: tuple[TrialConfig, ...]) -> dict[str, ParityFigures]:
    """:func:`check_on_cpu` for each distinct model of ``trials`` of at most :data:`CPU_PARAMS`
    parameters, with its trials' settings; by trial id, the figures of each trial checked."""
    by_model: dict[str, list[TrialConfig]] = {}
    for t in trials:
        by_model.setdefault(t.model.model_dump_json(), []).append(t)
    figures: dict[str, ParityFigures] = {}
    for group in by_model.values():
        spec = group[0].model
        if cpu_params(spec) > CPU_PARAMS:
            continue
        with _one_thread():
            done = check_on_cpu(spec, {FastPaths.of(t) for t in group})
        figures.update({t.trial_id: done[FastPaths.of(t)] for t in group})
    return figures
