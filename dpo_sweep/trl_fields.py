"""What TRL's ``DPOConfig`` accepts: its field names and which of them are deprecated, read from
the installed TRL, else from the list recorded with this package (``trl_fields.json``).

The TRL export (analysis/trl_export.py) and the trl trainer's validation ask here, so a field the
installed TRL does not know is never printed and a deprecated one is replaced by what TRL names
instead. Deprecation is read from TRL itself, two ways:

- the field's help text says so: it starts with "Deprecated" (an alias of another field) or names
  ``DPOTrainer`` among the trainers it is "Deprecated in" (``use_liger_kernel``, which only
  ``DPOTrainer.__init__`` warns about);
- building ``DPOConfig`` with the field set warns ``FutureWarning`` / ``DeprecationWarning``
  "`field` is deprecated ... Use `other` instead" (transformers' ``gradient_checkpointing``, whose
  help text TRL overrides without the word).

Importing TRL takes seconds, so callers build one :class:`TrlFields` per command and pass it on.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

#: The recorded list: TRL's DPOConfig as :func:`record` read it from the TRL the package was tested with.
RECORDED = Path(__file__).with_name("trl_fields.json")
#: The extra that installs TRL.
INSTALL_LINE = "pip install 'dpo-sweep[trl]'"
#: The oldest TRL whose DPOConfig and DPOTrainer the export and the trl trainer are written for.
MIN_VERSION = "1.16"

#: Fields the export may set, each with a value that differs from DPOConfig's default, so that
#: building DPOConfig with them makes every deprecated one warn.
PROBE_VALUES: Mapping[str, Any] = {
    "gradient_checkpointing": False, "activation_checkpointing": False, "use_liger_kernel": True,
    "padding_free": True, "pad_to_multiple_of": 64, "group_by_length": True, "truncation_mode": "keep_start",
    "precompute_ref_log_probs": True, "label_smoothing": 0.1, "loss_type": ["ipo"], "disable_dropout": False,
    "max_grad_norm": 0.5, "optim": "adamw_torch_fused", "torch_empty_cache_steps": 4,
}
_WARNED = re.compile(r"`(\w+)` is deprecated")
_INSTEAD = re.compile(r"[Uu]se `([^`]+)` instead")
_ALIAS = re.compile(r"alias of `(\w+)`")


@dataclass(frozen=True)
class TrlFields:
    """DPOConfig's fields in one TRL version."""

    version: str
    """TRL's version these fields are of."""
    installed: bool
    """True: read from the installed TRL; False: the recorded list (TRL is not installed here)."""
    fields: frozenset[str]
    """Every DPOConfig field name (TrainingArguments' included)."""
    deprecated: Mapping[str, str]
    """Deprecated field -> what TRL says to use instead (a field name, or a setting such as
    ``model_init_kwargs={"use_kernels": True}``; "" when it names nothing)."""
    unavailable: frozenset[str] = frozenset()
    """Fields that exist but that this TRL ignores ("Temporarily unavailable" in their help)."""
    fused_lm_head: bool = False
    """Whether DPOTrainer computes the log-probs through TRL's fused LM head (``add_fused_lm_head``:
    tiles of the vocabulary, never the full logits) rather than from the model's full logits."""

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a field of this DPOConfig that it neither deprecates nor ignores."""
        return name in self.fields and name not in self.deprecated and name not in self.unavailable

    def current_name(self, name: str) -> str | None:
        """``name``, or the field that replaces it when deprecated; None when neither is a usable field."""
        if self.knows(name):
            return name
        replacement = self.deprecated.get(name, "")
        return replacement if self.knows(replacement) else None

    def label(self) -> str:
        """``TRL 1.16.0 (installed)`` / ``TRL 1.16.0 (recorded list; TRL not installed)``."""
        return f"TRL {self.version} " + ("(installed)" if self.installed else "(recorded list; TRL not installed)")

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "fields": sorted(self.fields),
                "deprecated": dict(sorted(self.deprecated.items())), "unavailable": sorted(self.unavailable), "fused_lm_head": self.fused_lm_head}


def trl_installed() -> bool:
    """Whether TRL can be imported here (looked up, not imported)."""
    return importlib.util.find_spec("trl") is not None


def trainer_refusal() -> str | None:
    """Why ``train.trainer: trl`` cannot run here (TRL missing or older than :data:`MIN_VERSION`);
    None when it can. Reads TRL's installed version without importing it."""
    from importlib import metadata

    from packaging.version import Version

    if not trl_installed():
        return f"train.trainer: trl needs TRL >= {MIN_VERSION}, which is not installed: {INSTALL_LINE}"
    version = metadata.version("trl")
    if Version(version) < Version(MIN_VERSION):
        return f"train.trainer: trl needs TRL >= {MIN_VERSION}; TRL {version} is installed: {INSTALL_LINE}"
    return None


def _deprecated_by_help(help_text: str) -> tuple[bool, str]:
    """(deprecated, replacement) as a field's help text says it."""
    text = " ".join(help_text.split())
    by_alias = text.startswith("Deprecated")
    in_dpo = bool(re.search(r"Deprecated in [^.:]*`DPOTrainer`", text))
    if not (by_alias or in_dpo):
        return False, ""
    alias = _ALIAS.search(text) or _INSTEAD.search(text)
    return True, alias.group(1) if alias else ""


def _deprecated_by_warning(config_class: type, names: set[str]) -> dict[str, str]:
    """Fields of :data:`PROBE_VALUES` (present in ``names``) whose setting makes DPOConfig warn."""
    from transformers.utils import logging as hf_logging

    values = {k: v for k, v in PROBE_VALUES.items() if k in names}
    found: dict[str, str] = {}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the probes' own advice (device, FSDP) is not the user's to read
    try:
        for key, value in values.items():
            found.update(_probe(config_class, key, value, values))
    finally:
        hf_logging.set_verbosity(level)
    return found


def _probe(config_class: type, key: str, value: Any, values: Mapping[str, Any]) -> dict[str, str]:
    """{field: replacement} for what building DPOConfig with ``key=value`` warns is deprecated."""
    found: dict[str, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # bf16 off: DPOConfig's default bf16=True is refused on a machine without a GPU
            config_class(**{"bf16": False, "report_to": "none", key: value})
        except (ValueError, TypeError, ImportError):  # a value this version refuses alone: not a deprecation
            return found
    for w in caught:
        message = str(w.message)
        named = _WARNED.search(message)
        if issubclass(w.category, (FutureWarning, DeprecationWarning)) and named and named.group(1) in values:
            instead = _INSTEAD.search(message)
            found[named.group(1)] = instead.group(1) if instead else ""
    return found


def from_installed() -> TrlFields:
    """The installed TRL's DPOConfig (imports TRL: seconds)."""
    import trl
    from trl import DPOConfig
    from trl.trainer import dpo_trainer

    fields = {f.name: " ".join(str(f.metadata.get("help", "")).split()) for f in dataclasses.fields(DPOConfig)}
    deprecated = {}
    for name, help_text in fields.items():
        is_old, instead = _deprecated_by_help(help_text)
        if is_old:
            deprecated[name] = instead
    for name, instead in _deprecated_by_warning(DPOConfig, set(fields)).items():
        deprecated[name] = deprecated.get(name) or instead
    unavailable = {n for n, h in fields.items() if "Temporarily unavailable" in h}
    return TrlFields(trl.__version__, True, frozenset(fields), deprecated, frozenset(unavailable),
                     hasattr(dpo_trainer, "add_fused_lm_head"))


def from_recorded(path: Path = RECORDED) -> TrlFields:
    """The list recorded with the package (:func:`record`)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return TrlFields(data["version"], False, frozenset(data["fields"]), dict(data["deprecated"]),
                     frozenset(data.get("unavailable", ())), bool(data.get("fused_lm_head", False)))


def load() -> TrlFields:
    """The installed TRL's fields when TRL imports here, else the recorded list."""
    if trl_installed():
        try:
            return from_installed()
        except ImportError:  # installed but broken (a missing dependency): the recorded list still answers
            pass
    return from_recorded()


def record(path: Path = RECORDED) -> Path:
    """Write the installed TRL's fields to ``path`` (run when moving to a new TRL:
    ``python -c "from dpo_sweep import trl_fields; trl_fields.record()"``)."""
    path.write_text(json.dumps(from_installed().to_json(), indent=1) + "\n", encoding="utf-8")
    return path
