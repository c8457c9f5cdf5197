"""Preference pairs: read, normalise, tokenize and truncate.

Sources: a deterministic synthetic generator (token ids, no text), local .json/.jsonl/.parquet
files, or a Hugging Face dataset via ``datasets.load_dataset`` (read as rows by
:mod:`dpo_sweep.train.sources`). Layouts accepted:

* explicit ``prompt``, ``chosen``, ``rejected`` columns (rename others with ``data.columns``);
* implicit prompt: only ``chosen`` and ``rejected``, whose shared start is the prompt;
* each field a plain string or a list of ``{"role", "content"}`` chat messages. Messages are
  rendered with the tokenizer's chat template when it has one, otherwise with the plain rendering
  of :func:`render_messages` (``<|role|>\\ncontent\\n`` per message, ``<|assistant|>\\n`` to open
  the reply).

Truncation to ``max_length`` (see :func:`truncate_pair`): the prompt is cut from the left (its end
is kept, and so is a leading BOS token) so the responses keep their room, but never below
``min_prompt_tokens``; then the
responses are cut from the right. A pair whose truncated response keeps fewer than
``min_response_tokens`` tokens is dropped and counted.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from dpo_sweep.config import DataSpec, ModelSpec, SyntheticData, TrialConfig
from dpo_sweep.errors import DataError
from dpo_sweep.train.sources import SourceRows, read_rows

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class TokenizedPair:
    """One preference pair as token ids. Responses include their end-of-sequence token."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


@dataclass(frozen=True)
class PairDataset:
    """The pairs a trial trains on, with what truncation cost."""

    pairs: tuple[TokenizedPair, ...]
    source: str
    dropped: int = 0
    truncated: int = 0
    layout: str = ""  # how the rows read (:func:`layout_text`); "" for synthetic pairs
    identical: int = 0  # pairs whose chosen and rejected responses are the same text: no preference

    def __len__(self) -> int:
        return len(self.pairs)


#: (name_or_path, trust_remote_code); name_or_path None: the byte tokenizer every preset shares.
TokenizerKey = tuple[str | None, bool]
#: What one data read depends on: the data spec (as JSON), the tokenizer, max_length.
DataKey = tuple[str, TokenizerKey, int]


def tokenizer_key(model: ModelSpec) -> TokenizerKey:
    """Which tokenizer ``model`` uses (every preset shares the built-in byte tokenizer: one key)."""
    return (model.name_or_path, model.trust_remote_code)


def data_key(cfg: TrialConfig) -> DataKey:
    """Which data read a trial's pairs come from: trials of one key get the same pairs (the
    preflight's one :class:`~dpo_sweep.preflight.DataSummary` each, a warm worker's kept pairs)."""
    return (cfg.data.model_dump_json(), tokenizer_key(cfg.model), cfg.train.max_length)


# --------------------------------------------------------------------------------------------
# Normalising rows to (prompt, chosen, rejected) texts
# --------------------------------------------------------------------------------------------
def render_messages(messages: list[dict[str, Any]], tokenizer: Any, add_generation_prompt: bool) -> str:
    """Render chat messages: the tokenizer's chat template if it has one, else plain text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def _common_prefix_text(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    prefix = a[:n]
    # Back off to a word boundary so a shared first letter of two replies stays in the replies.
    if n < min(len(a), len(b)) and prefix and not prefix[-1].isspace():
        cut = max(prefix.rfind(" "), prefix.rfind("\n"))
        prefix = prefix[: cut + 1] if cut >= 0 else ""
    return prefix


def _common_prefix_messages(a: list[dict], b: list[dict]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _shown(value: Any, limit: int = 40) -> str:
    """A bad value for a message, cut short (a row can hold a whole conversation)."""
    text = repr(value)
    return f"({text if len(text) <= limit else text[:limit] + '...'})"


def check_row_types(row: dict[str, Any], where: str) -> None:
    """A row's chosen, rejected and prompt are text or message lists, chosen and rejected alike
    (columns already renamed); what needs no tokenizer of :func:`normalise_row`'s checks."""
    for key in ("chosen", "rejected"):
        v = row.get(key)
        if not (isinstance(v, str) or _is_messages(v)):
            got = "missing" if v is None else f"{type(v).__name__} {_shown(v)}"
            raise DataError(f"{where}: {key!r} is {got}; expected a string or a list of "
                            "{role, content} messages")
    chosen, rejected, prompt = row["chosen"], row["rejected"], row.get("prompt")
    if prompt is not None and not (isinstance(prompt, str) or _is_messages(prompt)):
        raise DataError(f"{where}: 'prompt' is {type(prompt).__name__} {_shown(prompt)}; expected a "
                        "string or a list of {role, content} messages (or no prompt)")
    chat = _is_messages(chosen)
    if chat != _is_messages(rejected):
        raise DataError(f"{where}: 'chosen' and 'rejected' must both be strings or both message lists")


def normalise_row(row: dict[str, Any], tokenizer: Any, where: str) -> tuple[str, str, str, bool]:
    """(prompt text, chosen text, rejected text, is_chat) of one row, columns already renamed."""
    check_row_types(row, where)
    chosen, rejected, prompt = row["chosen"], row["rejected"], row.get("prompt")
    chat = _is_messages(chosen)
    if not chat:
        if prompt is None:
            prompt = _common_prefix_text(chosen, rejected)
            if not prompt:
                raise DataError(
                    f"{where}: there is no prompt column and chosen/rejected share no start to take "
                    "as the prompt; add a 'prompt' column or map one with data.columns: {prompt: NAME}"
                )
            chosen, rejected = chosen[len(prompt):], rejected[len(prompt):]
        elif _is_messages(prompt):
            prompt = render_messages(prompt, tokenizer, add_generation_prompt=True)
        return prompt, chosen, rejected, False
    if prompt is None:
        n = _common_prefix_messages(chosen, rejected)
        if n == 0:
            raise DataError(
                f"{where}: there is no prompt column and the chosen/rejected conversations share "
                "no opening messages; add a 'prompt' column"
            )
        prompt_msgs, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    else:
        prompt_msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    prompt_text = render_messages(prompt_msgs, tokenizer, add_generation_prompt=True)
    texts = []
    for reply in (chosen, rejected):
        full = render_messages(prompt_msgs + reply, tokenizer, add_generation_prompt=False)
        # The reply is what the whole conversation adds to the rendered prompt.
        texts.append(full[len(prompt_text):] if full.startswith(prompt_text) else
                     render_messages(reply, tokenizer, add_generation_prompt=False))
    return prompt_text, texts[0], texts[1], True


# --------------------------------------------------------------------------------------------
# Tokenizing and truncating
# --------------------------------------------------------------------------------------------
def truncate_pair(
    prompt: list[int], chosen: list[int], rejected: list[int], *, max_length: int,
    min_prompt_tokens: int, min_response_tokens: int,
) -> tuple[list[int], list[int], list[int]] | None:
    """Fit prompt + the longer response into max_length, or None when the pair must be dropped.

    The prompt is cut from the left (its end, nearest the reply, is kept) down to what the
    responses leave, but not below ``min_prompt_tokens``; the responses are then cut from the
    right. ``None`` when a response that had to be cut keeps fewer than ``min_response_tokens``.
    """
    longest = max(len(chosen), len(rejected))
    if len(prompt) + longest <= max_length:
        return prompt, chosen, rejected
    keep_prompt = min(len(prompt), max(max_length - longest, min_prompt_tokens))
    prompt = prompt[len(prompt) - keep_prompt:]
    room = max_length - len(prompt)
    out = []
    for resp in (chosen, rejected):
        if len(resp) > room and room < min_response_tokens:
            return None
        out.append(resp[:room])
    return prompt, out[0], out[1]


def truncate_keeping_bos(prompt: list[int], chosen: list[int], rejected: list[int], bos: int | None,
                         spec: DataSpec, max_length: int) -> tuple[list[int], list[int], list[int]] | None:
    """:func:`truncate_pair`, but a leading BOS token survives the left cut of the prompt."""
    head = [bos] if bos is not None and prompt[:1] == [bos] else []
    cut = truncate_pair(prompt[len(head):], chosen, rejected, max_length=max_length - len(head),
                        min_prompt_tokens=spec.min_prompt_tokens, min_response_tokens=spec.min_response_tokens)
    return None if cut is None else (head + cut[0], cut[1], cut[2])


#: Rows tokenized per tokenizer call: a fast tokenizer encodes a list of texts in one call in
#: Rust, instead of one call per text (a third off the load: benchmarks/README.md#trial-costs).
ENCODE_BATCH_ROWS = 512


def _encode_all(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def check_columns(src: SourceRows, spec: DataSpec) -> dict[str, str]:
    """The first row has the columns ``data.columns`` maps and a chosen and a rejected one;
    returns the renaming (file column -> field)."""
    rows = src.rows
    rename = {v: k for k, v in spec.columns.items()}
    first = {rename.get(k, k) for k in rows[0]}
    found = ", ".join(sorted(map(str, rows[0]))) or "none"
    for field, column in spec.columns.items():
        if column not in rows[0]:  # a typo here would silently read another column or none
            raise DataError(f"{src.where(0)}: data.columns maps {field} to column {column!r}, which is "
                            f"not there (columns found: {found}); fix the name in data.columns")
    for need in ("chosen", "rejected"):
        if need not in first:
            raise DataError(
                f"{src.where(0)}: column {need!r} is missing (columns found: {found}); rename yours with "
                f"data.columns: {{{need}: <your column>}}"
            )
    return rename


def check_rows(src: SourceRows, spec: DataSpec) -> None:
    """What :func:`tokenize_rows` checks of the rows before it needs the tokenizer."""
    rename = check_columns(src, spec)
    for n, raw in enumerate(src.rows):
        check_row_types({rename.get(k, k): v for k, v in raw.items()}, src.where(n))


def layout_text(chat_rows: int, plain_rows: int, implicit_prompts: int, columns: dict[str, str],
                templated: bool) -> str:
    """How the rows were read, for the data line: plain strings or chat messages (and how those
    were rendered: a tokenizer without a chat template gets the plain ``<|role|>`` rendering),
    where the prompt came from, and the ``data.columns`` mapping."""
    rows = chat_rows + plain_rows
    if chat_rows and plain_rows:
        kind = f"{plain_rows} row(s) of plain strings and {chat_rows} of chat messages"
    else:
        kind = "chat messages" if chat_rows else "plain strings"
    parts = [kind]
    if chat_rows:
        parts.append("rendered with the tokenizer's chat template" if templated else
                     "rendered as plain '<|role|>' text: the tokenizer has no chat template")
    if implicit_prompts == rows:
        parts.append("prompt: the shared start of chosen and rejected")
    elif implicit_prompts:
        parts.append(f"prompt: a column, or in {implicit_prompts} row(s) the shared start of chosen and rejected")
    if columns:
        parts.append("columns mapped by data.columns (" + ", ".join(f"{k}: {v}" for k, v in columns.items()) + ")")
    return "; ".join(parts)


def tokenize_rows(src: SourceRows, spec: DataSpec, tokenizer: Any, max_length: int) -> PairDataset:
    """Normalise, tokenize and truncate rows into a :class:`PairDataset`."""
    rows, source = src.rows, src.source
    rename = check_columns(src, spec)
    bos = tokenizer.bos_token_id
    eos = tokenizer.eos_token_id
    pairs, dropped, truncated = [], 0, 0
    chat_rows = plain_rows = implicit_prompts = identical = 0
    n = 0
    while n < len(rows) and (spec.max_pairs is None or len(pairs) < spec.max_pairs):
        # Never more rows in a batch than pairs still wanted: no row after the last one kept is read.
        size = ENCODE_BATCH_ROWS if spec.max_pairs is None else min(ENCODE_BATCH_ROWS, spec.max_pairs - len(pairs))
        batch = []
        for k in range(n, min(n + size, len(rows))):
            row, where = {rename.get(key, key): v for key, v in rows[k].items()}, src.where(k)
            batch.append((where, row.get("prompt") is None, *normalise_row(row, tokenizer, where)))
        n += len(batch)
        ids = _encode_all(tokenizer, [text for item in batch for text in item[2:5]])
        for j, (where, implicit, prompt, chosen, rejected, chat) in enumerate(batch):
            chat_rows += chat
            plain_rows += not chat
            implicit_prompts += implicit
            identical += chosen == rejected
            p, c, r = ids[3 * j: 3 * j + 3]
            if bos is not None and not (p and p[0] == bos) and not chat:
                p = [bos] + p
            if not chat and eos is not None:
                c, r = c + [eos], r + [eos]
            if not c or not r:
                raise DataError(f"{where}: an empty response; both chosen and rejected need text")
            cut = truncate_keeping_bos(p, c, r, bos, spec, max_length)
            if cut is None:
                dropped += 1
                continue
            truncated += cut != (p, c, r)
            pairs.append(TokenizedPair(tuple(cut[0]), tuple(cut[1]), tuple(cut[2])))
    if not pairs:
        raise DataError(
            f"{source}: no pair left after truncation to max_length={max_length} ({dropped} dropped: "
            f"a response would keep fewer than {spec.min_response_tokens} tokens); raise "
            "train.max_length or lower data.min_response_tokens / data.min_prompt_tokens"
        )
    layout = layout_text(chat_rows, plain_rows, implicit_prompts, dict(spec.columns),
                         bool(getattr(tokenizer, "chat_template", None)))
    return PairDataset(tuple(pairs), source, dropped=dropped, truncated=truncated, layout=layout,
                       identical=identical)


def synthetic_length(rng: random.Random, median: int, syn: SyntheticData) -> int:
    """One prompt or response length: ``median`` (fixed), or lognormal around it (long-tailed)."""
    if syn.lengths == "fixed":
        return median  # no draw: the rng stream, and so the fixed-length pairs, do not depend on `lengths`
    return max(1, round(median * math.exp(rng.gauss(0.0, syn.sigma))))


def synthetic_pairs(spec: DataSpec, max_length: int, bos_id: int | None, eos_id: int) -> PairDataset:
    """Deterministic token-id pairs. The chosen reply follows the prompt (each token one more
    than the prompt token it echoes), the rejected one is random: a preference a model can learn
    (``signal: vocabulary``: the chosen reply's ids lie in the prompt's half of 0-255, the rejected
    one's in the other half).
    Token ids lie in 0-255, so any preset's vocabulary holds them. Lengths: see
    :func:`synthetic_length`; chosen and rejected lengths are drawn independently."""
    syn = spec.synthetic
    assert syn is not None
    rng = random.Random(syn.seed)
    pairs, dropped, truncated = [], 0, 0
    for _ in range(syn.pairs):
        n_prompt, n_chosen, n_rejected = (synthetic_length(rng, m, syn) for m in
                                          (syn.prompt_tokens, syn.response_tokens, syn.response_tokens))
        if syn.signal == "vocabulary":
            # The preference is a reply in the prompt's half of the ids (0-127 or 128-255, drawn per
            # pair): no token is better than another on its own, so only a model that reads the
            # prompt ranks pairs it never saw.
            half = 128 * rng.randrange(2)
            prompt = [half + rng.randrange(128) for _ in range(n_prompt)]
            chosen = [half + rng.randrange(128) for _ in range(n_chosen)]
            rejected = [128 - half + rng.randrange(128) for _ in range(n_rejected)]
        else:
            prompt = [rng.randrange(256) for _ in range(n_prompt)]
            chosen = [(prompt[i % len(prompt)] + 1) % 256 for i in range(n_chosen)]
            rejected = [rng.randrange(256) for _ in range(n_rejected)]
        p = ([bos_id] if bos_id is not None else []) + prompt
        whole = (p, chosen + [eos_id], rejected + [eos_id])
        cut = truncate_keeping_bos(*whole, bos_id, spec, max_length)
        if cut is None:
            dropped += 1
            continue
        truncated += cut != whole
        pairs.append(TokenizedPair(*(tuple(x) for x in cut)))
    if not pairs:
        raise DataError(
            f"data.synthetic: no pair fits max_length={max_length}; raise train.max_length or "
            "lower data.synthetic.response_tokens"
        )
    return PairDataset(tuple(pairs), "synthetic", dropped=dropped, truncated=truncated)


def load_pairs(spec: DataSpec, tokenizer: Any, max_length: int) -> PairDataset:
    """All preference pairs of a data spec, tokenized and truncated."""
    if spec.synthetic is not None:
        return synthetic_pairs(spec, max_length, tokenizer.bos_token_id, tokenizer.eos_token_id)
    return tokenize_rows(read_rows(spec), spec, tokenizer, max_length)
