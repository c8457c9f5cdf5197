"""Sequence log-probs of the response tokens, without holding [2B, T, V] float32 logits.

The chunked head (:class:`ChunkedTokenLogProbs`) computes the lm_head and log-softmax only for
response tokens (prompt and padding never reach the vocabulary projection), ``chunk_tokens``
rows at a time, and keeps only the hidden states; backward recomputes each chunk's logits and
forms ``d logp / d logits = onehot - softmax`` in place. Peak head memory is then about
``chunk_tokens x V x 6`` bytes instead of TRL's ``2B x T x V`` logits plus their float32
log-softmax and gradient. :func:`naive_token_logps` is the plain path, kept as the reference.

Both apply the model's own head semantics (:mod:`dpo_sweep.train.head`): the soft-capping or
logit scale its forward applies after the lm_head, in forward and in backward.
"""
from __future__ import annotations

import torch
from torch import nn

from dpo_sweep.train.head import HeadTransform, RouterAux, decoder, head_transform, router_aux

_IDENTITY = HeadTransform()


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on ``t`` run in: autocast's when it is on for t's device, else t's own."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


class ChunkedTokenLogProbs(torch.autograd.Function):
    """``log_softmax(transform(hidden @ weight.T + bias))[label]`` per row, chunk by chunk,
    recomputed in backward; ``transform``: the family's :class:`~dpo_sweep.train.head.HeadTransform`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_tokens, compute_dtype, transform):  # type: ignore[override]
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        w = weight.to(compute_dtype)
        for s in range(0, hidden.shape[0], chunk_tokens):
            logits = transform.apply_(_chunk_logits(hidden[s:s + chunk_tokens], w, bias, compute_dtype))
            lab = labels[s:s + chunk_tokens, None]
            out[s:s + chunk_tokens] = (logits.gather(1, lab) - torch.logsumexp(logits, -1, keepdim=True)).squeeze(1)
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.chunk_tokens, ctx.compute_dtype, ctx.transform = chunk_tokens, compute_dtype, transform
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, bias, labels = ctx.saved_tensors
        chunk, cdt, transform = ctx.chunk_tokens, ctx.compute_dtype, ctx.transform
        w = weight.to(cdt)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b and bias is not None else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk].to(cdt)
            logits = transform.apply_(_chunk_logits(h, w, bias, cdt))
            # A soft-cap's derivative needs the capped logits: one more chunk-sized buffer then.
            capped = logits.clone() if transform.softcap is not None else None
            # softmax in place (reuses the float32 logits buffer), then (onehot - p) * g.
            probs = logits.sub_(torch.logsumexp(logits, -1, keepdim=True)).exp_()
            g = grad_out[s:s + chunk, None].float()
            grad_logits = probs.mul_(-g)
            grad_logits.scatter_add_(1, labels[s:s + chunk, None], g)
            gl = transform.backward_(grad_logits, capped).to(cdt)
            del probs, logits, grad_logits, capped
            if need_h:
                grad_h[s:s + chunk] = gl @ w
            if need_w:
                if grad_w.dtype == gl.dtype:
                    grad_w.addmm_(gl.t(), h)  # one rounding per chunk, in the weight's dtype
                else:
                    grad_w += (gl.t() @ h).to(grad_w.dtype)
            if grad_b is not None:
                grad_b += gl.sum(0).to(grad_b.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    logits = h.to(dtype) @ w.t()
    if bias is not None:
        logits = logits + bias.to(dtype)
    return logits.float()


def chunked_token_logps(hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor, chunk_tokens: int,
                        transform: HeadTransform = _IDENTITY) -> torch.Tensor:
    """Log-prob of ``labels[i]`` after ``hidden[i]``, for rows of a ``[N, H]`` hidden matrix."""
    cdt = compute_dtype(hidden)
    with torch.autocast(hidden.device.type, enabled=False):
        return ChunkedTokenLogProbs.apply(hidden, head.weight, head.bias, labels, chunk_tokens, cdt, transform)


def naive_token_logps(hidden: torch.Tensor, head: nn.Linear, labels: torch.Tensor,
                      transform: HeadTransform = _IDENTITY) -> torch.Tensor:
    """The plain path: full logits, the head transform and log-softmax in float32, gather.
    Reference for tests and benchmarks."""
    logits = transform.apply(head(hidden).float())
    return logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


class SequenceLogProbs(nn.Module):
    """Wraps a causal LM: batch -> summed response log-probs and response lengths per sequence.

    A module (not a function) so that DDP / FSDP can wrap the whole policy computation.
    ``chunk_tokens == 0`` selects the naive head over all positions, as TRL computes it. The
    head applies ``lm``'s own transform (:func:`~dpo_sweep.train.head.head_transform`).

    ``router_aux_loss``: add the MoE's load-balancing loss where the config asks for it (the policy;
    a reference has no loss to add). The last forward's weighted auxiliary loss is then
    :attr:`aux_loss` (a 0-dim tensor in the graph; None without one), which the step adds to its
    loss as the model's own forward adds it to its language-model loss.
    """

    def __init__(self, lm: nn.Module, chunk_tokens: int = 1024, router_aux_loss: bool = False):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.transform = head_transform(lm)
        self.router: RouterAux | None = router_aux(lm) if router_aux_loss else None
        self.aux_loss: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor, response_mask: torch.Tensor,
                sequence_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per sequence: summed response log-probs and response token counts.

        ``sequence_ids`` (packed rows, :func:`dpo_sweep.train.batching.pack`): the sequence each
        token belongs to; None: one sequence per row.
        """
        extra = {"output_router_logits": True} if self.router is not None else {}
        out = decoder(self.lm)(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False, **extra)
        hidden = out[0]
        if self.router is not None:
            self.aux_loss = self.router(out.router_logits, attention_mask)
        head = self.lm.get_output_embeddings()
        # Token t is predicted from position t-1: shift, keep only response tokens.
        target = response_mask[:, 1:]
        labels = input_ids[:, 1:]
        if sequence_ids is None:
            n = input_ids.shape[0]
            sequence_ids = torch.arange(n, device=input_ids.device)[:, None].expand_as(input_ids)
        else:
            # A CPU-GPU sync point in packed mode only: the sequence count sizes the sums below.
            n = int(sequence_ids[0, -1]) + 1
        # A target token's sequence is its own (position t), not that of the token predicting it.
        rows = sequence_ids[:, 1:][target]
        if self.chunk_tokens > 0:
            token_logps = chunked_token_logps(hidden[:, :-1][target], head, labels[target], self.chunk_tokens,
                                              self.transform)
        else:
            token_logps = naive_token_logps(hidden[:, :-1], head, labels, self.transform)[target]
        logps = torch.zeros(n, dtype=torch.float32, device=input_ids.device).index_add(0, rows, token_logps)
        counts = torch.zeros(n, dtype=torch.long, device=input_ids.device).index_add_(
            0, rows, torch.ones_like(rows))
        return logps, counts
