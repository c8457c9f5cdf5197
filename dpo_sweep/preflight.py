"""Preflight: every check of the user's input that needs no GPU, made before any work starts.

A bad data row, a missing checkpoint folder or an output path that is a file would otherwise be
found by every trial's worker, after Ray has started (one traceback per trial), or - for
``trial`` - after the training, when the results are written. The checks:

* models: each distinct ``model.name_or_path`` is an existing folder holding a config, weights
  and tokenizer files, or a hub id; its config and tokenizer load (no weights are read);
* data: each distinct (data, tokenizer, max_length) of the trials is read and tokenised exactly
  as a worker will, and every trial's micro_batch x workers can be filled from what is left;
* output: the folder is, or can be created as, a writable directory;
* parity: each small model's fast paths (chunked head, checkpoint level, lean ops, padding-free)
  against its own forward, in float32 on the CPU (dpo_sweep/train/parity.py).

``validate`` checks all four (it writes nothing, so it has no output folder); a memory lever that
cannot run here (its package missing, or CUDA only on a machine without a GPU) it says and does not
refuse: it only predicts, and ``run`` and ``trial`` refuse it (:func:`check_levers`). ``run`` makes the
checks that only read files (:func:`check_files`: the output folder, the checkpoint folders' files,
the data files' rows) before Ray starts, so such a mistake never starts it, and the rest (the
tokenizers, the tokenised data, from the rows those checks read) beside Ray's start
(dpo_sweep/sweep/startup.py). ``trial`` checks the output folder, the models and their parity before it trains; its
data is read once, by the trial itself, whose data errors come before the first step.
A failed check is a :class:`UserError`: exit 2, the file, line or field named, and the fix.
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dpo_sweep.config import ModelSpec, TrialConfig, distinct_models
from dpo_sweep.refusals import LEVER_PACKAGES, cuda_levers
from dpo_sweep.core import trial_facts
from dpo_sweep.core.levels import Level
from dpo_sweep.errors import DataError, UserError
from dpo_sweep.results_dir import ResultsDir
# standard library only: cheap to import
from dpo_sweep.train.data import (DataKey, PairDataset, TokenizerKey, check_rows, data_key, load_pairs, tokenize_rows,
                                  tokenizer_key)
from dpo_sweep.core.lengths import LengthProfile, data_shape
from dpo_sweep.train.sources import SourceRows, read_file


@dataclass(frozen=True)
class DataSummary:
    """What one (data, tokenizer, max_length) gave."""

    source: str
    model: str  # whose tokenizer
    max_length: int
    pairs: int
    truncated: int
    dropped: int
    max_token_id: int
    key: DataKey = ("", (None, False), 0)
    #: Lengths after truncation (the planner's worst micro-batch) and data.json's entry.
    lengths: LengthProfile | None = None
    shape: dict[str, Any] | None = None

    layout: str = ""  # how the rows read (train.data.layout_text); "" for synthetic pairs
    identical: int = 0  # pairs with the same chosen and rejected response

    def line(self) -> str:
        return (f"data {self.source}: {self.pairs} pair(s) with the {self.model} tokenizer at max_length "
                f"{self.max_length} ({self.truncated} truncated, {self.dropped} dropped)"
                + (f"; read as {self.layout}" if self.layout else ""))

    def notes(self) -> list[str]:
        """What the data holds that trains nothing, one ``note:`` line each."""
        if not self.identical:
            return []
        return [f"note: data {self.source}: {self.identical} pair(s) have identical chosen and rejected "
                "responses; they carry no preference (their DPO gradient is zero): remove them or fix "
                "their responses"]


# --- output folder ----------------------------------------------------------------------------


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (a probe, removed at once: os.access says yes
    to root even on a read-only file system)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_output_dir(out_dir: Path, flag: str = "--output") -> None:
    """``out_dir`` is a writable directory, or one can be created there. Creates nothing."""
    shown = f"{flag} {out_dir}"
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{shown}: this is an existing file, not a directory; give a directory "
                        f"(created when missing), e.g. {flag} {out_dir}-results")
    existing = out_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{shown}: {existing} is a file, so no directory can be created under it; "
                        "give a path whose parent folders are directories")
    if not _writable(existing):
        raise UserError(f"{shown}: {existing} is not writable (permissions or a read-only file "
                        "system); give a folder you can write to")
    for target in ResultsDir(out_dir).row_files:
        if target.exists() and not target.is_file():
            raise UserError(f"{shown}: {target} exists and is not a file, so the results cannot be "
                            "written there; move it away or give another --output")


# --- models -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedModels:
    """What the model check loaded, for the data check."""

    tokenizers: dict[TokenizerKey, Any]
    vocab_sizes: dict[str, int | None]  # by ModelSpec.label(); None when the config has none


def _require_checkpoint_files(spec: ModelSpec) -> None:
    """``spec``'s checkpoint folder holds a config, tokenizer files and weights (a hub id: nothing
    to check here)."""
    from dpo_sweep.models import pretrained

    pretrained.require_files(pretrained.locate(spec.name_or_path or ""), (pretrained.CONFIG_FILE,),
                             pretrained.TOKENIZER_FILES, pretrained.WEIGHT_FILES)


def check_models(trials: Iterable[TrialConfig]) -> CheckedModels:
    """Each distinct checkpoint's files, config and tokenizer (presets need nothing)."""
    from dpo_sweep.models import pretrained
    from dpo_sweep.models.presets import PRESETS
    from dpo_sweep.train.tokenizer import load_tokenizer

    tokenizers: dict[TokenizerKey, Any] = {}
    vocab_sizes: dict[str, int | None] = {}
    for spec in distinct_models(trials):
        if spec.preset is not None:
            vocab_sizes[spec.label()] = PRESETS[spec.preset]["vocab_size"]
        else:
            _require_checkpoint_files(spec)
            vocab_sizes[spec.label()] = getattr(pretrained.load_config(spec), "vocab_size", None)
            if spec.attn_implementation != "auto":  # auto picks a supported one
                _, supported, model_class = pretrained.attention_support(spec)
                if refusal := trial_facts.refused_attention_support(spec.attn_implementation, supported, model_class):
                    raise UserError(f"{spec.label()}: {refusal}")
        if tokenizer_key(spec) not in tokenizers:
            tokenizers[tokenizer_key(spec)] = load_tokenizer(spec)
    check_families(trials)
    return CheckedModels(tokenizers, vocab_sizes)


def check_families(trials: Iterable[TrialConfig]) -> None:
    """Each trial's model family takes its checkpoint level and LoRA targets exactly (models/family.py:
    read from the model's meta-device build): a hybrid model, a level without the region it
    recomputes, or a LoRA target that is no linear layer is refused here, before any trial."""
    from dpo_sweep.models.family import refused_trial

    seen: set[tuple[int, int, int, str]] = set()
    for cfg in trials:
        # What the checks read: the model, the level, the train and resources sections (adapter,
        # targets, device). A space's trials share their section objects (space_expand), so each
        # set-up is checked once, in order, however many betas or grad_accs it is swept over.
        key = (id(cfg.model), id(cfg.train), id(cfg.resources), cfg.checkpoint_level)
        if key in seen:
            continue
        seen.add(key)
        try:
            refused = refused_trial(cfg)
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - whatever transformers raises building an unknown family
            raise UserError(f"{cfg.model.label()}: its model could not be built from its config to read its layers "
                            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); check config.json, "
                            "or model.trust_remote_code for a model with its own code") from None
        if refused:
            raise UserError(f"{cfg.model.label()}: {refused}")
        if refused := _auto_attention_refusal(cfg):
            raise UserError(f"{cfg.model.label()}: {refused}")


def _auto_attention_refusal(cfg: TrialConfig) -> str | None:
    """Why ``cfg``'s level cannot go with the attention ``auto`` resolves to for its model (the
    space's check sees only ``auto``): a model whose config names eager, or that supports no fused
    kernel, runs L2/L3's attention region on separate ops. None where it goes, or where flash
    attention may be chosen on the trial's GPU (its trial says whether flash-attn is there)."""
    from dpo_sweep.models import pretrained

    if cfg.model.attn_implementation != "auto" or not Level(cfg.checkpoint_level).regions.attention:
        return None
    named, supported, model_class = pretrained.attention_support(cfg.model)
    device = trial_facts.planned_device(cfg)
    resolved = trial_facts.attention("auto", device, flash_attn=device == "cuda", named=named, supported=supported)
    if resolved in trial_facts.KERNEL_ATTENTION:
        return None
    why = (f"its config.json names attn_implementation {named}" if named == resolved
           else f"transformers supports only {', '.join(supported)} for {model_class}")
    return (f"checkpoint_level {cfg.checkpoint_level} is refused: attn_implementation auto resolves to {resolved} "
            f"for this model ({why}), whose separate matmul and softmax ops {cfg.checkpoint_level}'s "
            "selective-checkpoint policy cannot keep; use checkpoint_level L1 or full")


# --- data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedFiles:
    """What :func:`check_files` read: each local data file's rows, by ``DataSpec`` JSON."""

    rows: dict[str, SourceRows]


def _read_pairs(cfg: TrialConfig, tokenizer: Any, rows: SourceRows | None = None) -> PairDataset:
    """``cfg``'s pairs, tokenised; ``rows``: its data file's rows when :func:`check_files` read
    them already (the file is not read again)."""
    try:
        if rows is not None:
            return tokenize_rows(rows, cfg.data, tokenizer, cfg.train.max_length)
        return load_pairs(cfg.data, tokenizer, cfg.train.max_length)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. a chat template that fails on a row's messages
        where = cfg.data.path or cfg.data.hf or "data.synthetic"
        raise DataError(f"{where}: could not be turned into token ids with the {cfg.model.label()} "
                        f"tokenizer ({type(err).__name__}: {err}); check the file's rows") from None


def check_fill(cfg: TrialConfig, summary: DataSummary) -> None:
    """The pairs left after truncation fill at least one effective batch (micro_batch x grad_acc
    x workers: every split of an effective batch uses the same pairs, train/batching.py)."""
    from dpo_sweep.train.batching import usable_pairs

    workers = cfg.resources.workers_per_trial
    if usable_pairs(summary.pairs, cfg.micro_batch, workers, grad_acc=cfg.grad_acc) == 0:
        raise DataError(f"{summary.source}: {summary.pairs} pair(s) left after truncation to max_length="
                        f"{summary.max_length} cannot fill one effective batch of micro_batch "
                        f"{cfg.micro_batch} x grad_acc {cfg.grad_acc} x {workers} worker(s) (trial "
                        f"{cfg.trial_id}); use more pairs or a smaller micro_batch or grad_acc")


def check_vocab(cfg: TrialConfig, summary: DataSummary, vocab_size: int | None) -> None:
    """Every token id of the data has a row in the model's embedding (a tokenizer saved from
    another model fails in every worker's first forward otherwise)."""
    if vocab_size is not None and summary.max_token_id >= vocab_size:
        raise DataError(f"{summary.source}: the {summary.model} tokenizer gives token id "
                        f"{summary.max_token_id}, but {cfg.model.label()} has a vocabulary of {vocab_size} "
                        "(config.json vocab_size); use the tokenizer saved with this model")


def _max_token_id(ds: PairDataset) -> int:
    return max((max(ids) for p in ds.pairs for ids in (p.prompt_ids, p.chosen_ids, p.rejected_ids) if ids),
               default=-1)


#: Rows of a data file from which the preflight says it is tokenising them before it does.
LARGE_DATA_ROWS = 50_000


def check_data(trials: Iterable[TrialConfig], models: CheckedModels,
               files: CheckedFiles | None = None) -> tuple[DataSummary, ...]:
    """Read and tokenise each distinct (data, tokenizer, max_length) once, as the workers will;
    ``files``: the data files' rows :func:`check_files` read."""
    rows = files.rows if files is not None else {}
    summaries: dict[DataKey, DataSummary] = {}
    for cfg in trials:
        key = data_key(cfg)
        if key not in summaries:
            source_rows = rows.get(cfg.data.model_dump_json())
            if source_rows is not None and len(source_rows.rows) >= LARGE_DATA_ROWS:
                # Tokenising a million pairs takes minutes on a CPU: say what the wait is.
                print(f"data {source_rows.source}: tokenising {len(source_rows.rows):,} rows with the "
                      f"{cfg.model.label()} tokenizer (data.max_pairs reads fewer) ...", file=sys.stderr, flush=True)
            ds = _read_pairs(cfg, models.tokenizers[key[1]], source_rows)
            lengths = LengthProfile.of(ds)
            summaries[key] = DataSummary(ds.source, cfg.model.label(), cfg.train.max_length, len(ds),
                                         ds.truncated, ds.dropped, _max_token_id(ds), key, lengths,
                                         data_shape(ds, lengths, model=cfg.model.label(),
                                                    max_length=cfg.train.max_length,
                                                    max_pairs=cfg.data.max_pairs),
                                         layout=ds.layout, identical=ds.identical)
        check_fill(cfg, summaries[key])
        check_vocab(cfg, summaries[key], models.vocab_sizes[cfg.model.label()])
    return tuple(summaries.values())


def lengths_by_trial(trials: Iterable[TrialConfig], data: Iterable[DataSummary]) -> dict[str, LengthProfile | None]:
    """Each trial's data lengths, from the summaries :func:`check_data` returned (nothing is read
    again): what the planner's memory model sizes the worst micro-batch of, in ``validate`` and
    ``run`` alike. By trial id, which outlives the sweep's rewriting of data paths to absolute ones."""
    by_key = {s.key: s.lengths for s in data}
    return {t.trial_id: by_key.get(data_key(t)) for t in trials}


# --- the commands' checks ---------------------------------------------------------------------


def check_files(trials: Iterable[TrialConfig], out_dir: Path | None = None) -> CheckedFiles:
    """The checks that only read files and import no tokenizer or torch (milliseconds): the
    output folder, each local checkpoint folder's files, each local data file's columns and the
    types of its rows' values. The rows read are kept for :func:`check_data`."""
    trials = tuple(trials)
    if out_dir is not None:
        check_output_dir(out_dir)
    for spec in distinct_models(trials):
        if spec.preset is None:
            _require_checkpoint_files(spec)
    rows: dict[str, SourceRows] = {}
    for key, spec in {t.data.model_dump_json(): t.data for t in trials if t.data.path is not None}.items():
        rows[key] = read_file(spec.path)
        check_rows(rows[key], spec)
    return CheckedFiles(rows)


def lever_problems(trials: Iterable[TrialConfig]) -> list[str]:
    """What keeps the memory levers from running on this machine: a package that is not installed
    (peft for LoRA/QLoRA, torchao for QLoRA and the low-bit AdamW), or a lever that runs on CUDA
    only without a GPU here (the machine that runs the command: a sweep whose workers are on other
    machines is checked where it starts). Empty when they can run."""
    trials = tuple(trials)
    problems = []
    for field, value, package in sorted({(f, getattr(t.train, f), pkg) for t in trials
                                         for (f, v), pkgs in LEVER_PACKAGES.items() if getattr(t.train, f) == v
                                         for pkg in pkgs}):
        if importlib.util.find_spec(package) is None:
            problems.append(f"train.{field}: {value} needs the {package} package, which is not installed; "
                            f"pip install {package}")
    if any(cuda_levers(t.train) for t in trials):
        import torch

        cuda = torch.cuda.is_available()
        levers = sorted({lever for t in trials if not trial_facts.runs_on_cuda(t.train, t.resources, cuda)
                         for lever in cuda_levers(t.train)})
        if levers:
            problems.append(f"train.{', train.'.join(levers)} runs on a CUDA GPU only (torchao) and this machine "
                            "has none; use adapter: lora or full and optimizer: adamw here, or run on a GPU")
    return problems


def check_levers(trials: Iterable[TrialConfig]) -> None:
    """Refuses (UserError) levers that cannot run here (:func:`lever_problems`): ``run`` and ``trial``."""
    problems = lever_problems(trials)
    if problems:
        raise UserError(problems[0])


def lever_notes(trials: Iterable[TrialConfig]) -> list[str]:
    """``validate``'s lines for levers that cannot run here: it only predicts, which needs neither
    the packages nor a GPU, so they are said and not refused."""
    return [f"note: {p} (validate predicts it here; only running it needs that)" for p in lever_problems(trials)]


def check_inputs(trials: tuple[TrialConfig, ...], out_dir: Path | None = None,
                 files: CheckedFiles | None = None, levers: bool = True) -> tuple[DataSummary, ...]:
    """Everything ``validate`` and ``run`` check before any trial (the file checks first: they are
    the cheapest; ``files``: they were made already). Returns what the data gave, for the command
    to print."""
    files = check_files(trials, out_dir) if files is None else files
    if levers:  # validate (levers=False) predicts them and says what running them needs instead
        check_levers(trials)
    data = check_data(trials, check_models(trials), files)
    check_parity(trials)
    return data


def check_parity(trials: Iterable[TrialConfig]) -> None:
    """The fast paths of the trials (chunked head, checkpoint level, lean ops, padding-free)
    against each model's own forward, in float32 on the CPU, for every model small enough there
    (dpo_sweep/train/parity.py); a larger model is checked inside each of its trials."""
    from dpo_sweep.train.parity import check_trials

    check_trials(tuple(trials))


def check_trial(cfg: TrialConfig, out_dir: Path) -> None:
    """What ``trial`` checks before it trains: the output folder, the model's files, the levers."""
    check_output_dir(out_dir)
    check_models([cfg])
    check_levers([cfg])
    check_parity([cfg])
