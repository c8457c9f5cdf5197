"""Real checkpoints (``model.name_or_path``): where one is, and its config and tokenizer, loaded
without weights, with messages a user can act on instead of transformers' own.

``name_or_path`` is a local directory when one exists at that path; otherwise it must be a
plausible Hugging Face hub id (``gpt2``, ``meta-llama/Llama-3.2-1B``), fetched where a hub is
reachable. Anything else (``/data/ckpt``, ``./ckpt``, ``a/b/c``) was meant as a directory, so a
missing one is "no such directory", not transformers' "Repo id must be in the form ...".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweep.config import ModelSpec
from dpo_sweep.errors import UserError
from dpo_sweep.text import excerpt

CONFIG_FILE = "config.json"
#: One of these holds the weights (transformers' file names, sharded or not).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
#: One of these lets AutoTokenizer build a tokenizer without converting anything: a fast
#: tokenizer's serialisation, a sentencepiece model, or a BPE / WordPiece vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")
_FIELD = "model.name_or_path"
_EXAMPLE = "give a checkpoint directory (saved with save_pretrained) or a hub id such as meta-llama/Llama-3.2-1B"


@dataclass(frozen=True)
class Checkpoint:
    """A located ``name_or_path``: a local directory, or a hub id."""

    name: str
    local_dir: Path | None  # None: a hub id

    @property
    def where(self) -> str:
        return f"{_FIELD}: {self.local_dir}" if self.local_dir else f"{_FIELD}: hub id {self.name!r}"


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a hub repo id (``repo`` or ``namespace/repo``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def locate(name_or_path: str) -> Checkpoint:
    """The directory or hub id ``name_or_path`` names; UserError when it is neither."""
    path = Path(name_or_path)
    if path.is_dir():
        return Checkpoint(name_or_path, path)
    if path.exists():
        raise UserError(f"{_FIELD}: {name_or_path} is a file, not a directory; {_EXAMPLE}")
    if is_hub_id(name_or_path):
        return Checkpoint(name_or_path, None)
    raise UserError(f"{_FIELD}: no such directory: {name_or_path} (and not a hub id either); {_EXAMPLE}")


def require_files(ckpt: Checkpoint, *groups: tuple[str, ...]) -> None:
    """UserError naming the folder and, of each group of file names, the ones it lacks all of.
    Nothing to check for a hub id (the hub says what it has when asked)."""
    if ckpt.local_dir is None:
        return
    d = ckpt.local_dir
    missing = [g[0] if len(g) == 1 else "one of " + ", ".join(g)
               for g in groups if not any((d / f).is_file() for f in g)]
    if missing:
        raise UserError(f"{ckpt.where}: the folder lacks {' and '.join(missing)}. A checkpoint folder "
                        "holds what model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR) "
                        "write; add the missing files or point at the complete folder")


def _load_error(ckpt: Checkpoint, what: str, err: Exception) -> UserError:
    first = (str(err).strip().splitlines() or [""])[0]
    fix = ("check the files in it" if ckpt.local_dir else
           "check the id and that the hub is reachable (or download the checkpoint and give its directory)")
    return UserError(f"{ckpt.where}: could not load the {what} ({type(err).__name__}: {first}); {fix}")


def weights_error(spec: ModelSpec, err: Exception) -> UserError:
    """One line for weights that could not be loaded (a ``pytorch_model.bin`` holding a pickled
    object that torch's safe loader refuses, a damaged file): the file, the cause, the fix."""
    ckpt = locate(spec.name_or_path or "")
    files = [ckpt.local_dir / f for f in WEIGHT_FILES if ckpt.local_dir and (ckpt.local_dir / f).is_file()]
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    cause = next((ln for ln in lines if "Unpickler error" in ln), lines[0] if lines else "").split(" Please ")[0]
    unsafe = "Unpickler" in cause or "weights_only" in str(err)
    why = ("holds a pickled object other than tensors, which the safe loader refuses to run" if unsafe
           else "cannot be read")
    return UserError(f"{_FIELD}: {files[0] if files else ckpt.name}: the weights file {why} "
                     f"({type(err).__name__}: {excerpt(cause, 200)}); save the model with save_pretrained "
                     "(safetensors) from a source you trust, or point at another checkpoint")


def load_config(spec: ModelSpec) -> Any:
    """The checkpoint's transformers config (config.json only, no weights)."""
    from transformers import AutoConfig

    ckpt = locate(spec.name_or_path or "")
    require_files(ckpt, (CONFIG_FILE,))
    try:
        return AutoConfig.from_pretrained(spec.name_or_path, trust_remote_code=spec.trust_remote_code)
    except Exception as err:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ...
        raise _load_error(ckpt, "model config", err) from None


def load_checkpoint_tokenizer(spec: ModelSpec) -> Any:
    """The checkpoint's own tokenizer (AutoTokenizer), or UserError naming the files expected."""
    from transformers import AutoTokenizer

    ckpt = locate(spec.name_or_path or "")
    require_files(ckpt, TOKENIZER_FILES)
    try:
        return AutoTokenizer.from_pretrained(spec.name_or_path, trust_remote_code=spec.trust_remote_code)
    except Exception as err:  # noqa: BLE001 - transformers raises OSError, ValueError, ImportError, ...
        raise _load_error(ckpt, "tokenizer", err) from None


def attention_support(spec: ModelSpec) -> tuple[str | None, tuple[str, ...], str]:
    """(the attention ``spec``'s config.json names or None, the implementations its model class
    supports of trial_facts.ATTENTIONS, the class name). A preset: none named, all supported."""
    from dpo_sweep.core.trial_facts import ATTENTIONS

    if spec.preset is not None:
        return None, ATTENTIONS, ""
    cfg = load_config(spec)
    named = getattr(cfg, "_attn_implementation", None)
    cls = causal_lm_class(cfg)
    if cls is None:  # custom modelling code: it says what it supports only once built
        return named, ATTENTIONS, ""
    flags = {"flash_attention_2": "_supports_flash_attn", "sdpa": "_supports_sdpa"}
    supported = tuple(impl for impl in ATTENTIONS if getattr(cls, flags.get(impl, ""), True))
    return named, supported, cls.__name__


def causal_lm_class(cfg: Any) -> type | None:
    """transformers' CausalLM class of a config (None for a model type it does not ship)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    except KeyError:
        return None
