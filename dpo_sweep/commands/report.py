"""``dpo-sweep report`` and ``dpo-sweep recommend``, and :func:`analyse_dir`, which ``dpo-sweep run`` ends with.

One linear story: load the results dir, compute the frontier, pick a recommendation, then write
frontier.md, recommendation.json and report.html (or just print, for ``recommend``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pandas as pd

from dpo_sweep import migrate, space as space_mod
from dpo_sweep.analysis import forecast as forecast_mod, noise_floor, pareto, results, tables, trainer_switch, winner as winner_mod
from dpo_sweep.analysis.completeness import Completeness, completeness
from dpo_sweep.analysis.reasons import amount
from dpo_sweep.analysis.recommend import DEFAULT_SAFETY_MARGIN, Recommendation, recommend
from dpo_sweep.cards import Card
from dpo_sweep.config import ModelSpec, ObjectivesSpec, ResourcesSpec
from dpo_sweep.files import write_text_atomic
from dpo_sweep.report import headline
from dpo_sweep.report.headline import Banner
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.space import SweepSpace
from dpo_sweep.trl_fields import TrlFields

if TYPE_CHECKING:
    from dpo_sweep.plan.shape import ModelShape

#: Banners the console says in incomplete_line's one line instead.
CONSOLE_UNFINISHED = ("incomplete", "pending")


@dataclass(frozen=True)
class AnalysisOutcome:
    """What analyse_dir wrote and found."""

    frontier_markdown: str
    """The frontier table (markdown), ready to print."""
    report_path: Path
    frontier_path: Path
    recommendation_path: Path
    recommendation: dict[str, Any]
    """recommendation.json's content."""
    analysed: pd.DataFrame = field(compare=False, repr=False)
    """results.csv plus the frontier columns (eligible, on_frontier, frontier_distance, frontier_rank)."""
    objectives: tuple[pareto.Objective, ...] = ()
    """The objectives the frontier was taken over."""
    recommendation_text: str = ""
    """The recommendation as ``dpo-sweep recommend`` prints it (:func:`format_recommendation`)."""
    recommended_path: Path | None = None
    """DIR/recommended.yaml, the winner pinned; None when nothing was recommended or it cannot be pinned."""
    winner_text: str = ""
    """Where recommended.yaml is and the winner as TRL arguments (:func:`format_winner`)."""
    forecast_text: str = ""
    """The whole run's forecast (and estimates on other cards), for the console (forecast.lines)."""
    completeness: Completeness = Completeness(None)
    """Whether the folder holds the whole sweep."""


@dataclass(frozen=True)
class SpaceSettings:
    """What the analysis takes from the sweep's space, as config.py validated it."""

    gpu_memory_gb: float | None = None
    """``resources.gpu_memory_gb``: the card the sweep emulated (None: not capped)."""
    objectives: dict[str, Any] | None = None
    """``objectives:`` with only the names the file gives (None: it gives none, use the defaults)."""

    @classmethod
    def of(cls, resources: ResourcesSpec | None, objectives: ObjectivesSpec | None) -> "SpaceSettings":
        return cls(gpu_memory_gb=resources.gpu_memory_gb if resources is not None else None,
                   objectives=objectives.model_dump(exclude_unset=True) if objectives is not None else None)

    @classmethod
    def from_space(cls, spec: SweepSpace) -> "SpaceSettings":
        """A validated space (the sweep's own, parsed once at its start)."""
        return cls.of(spec.resources, spec.objectives if "objectives" in spec.model_fields_set else None)


def load_space_settings(out_dir: Path) -> SpaceSettings:
    """DIR/space.yaml's resources and objectives (the runner's copy of the space file), each
    section validated by its config model; the defaults when the file is absent. The analysis
    needs no other section, so a hand-written file of only these keys is enough."""
    path = ResultsDir(out_dir).space
    if not path.is_file():
        return SpaceSettings()
    raw = space_mod.load_raw(path)
    objectives = raw.get("objectives")
    old = migrate.has_step_time(objectives)
    if old:  # validated without it; pareto.objectives_from_spec reads it as throughput, saying so
        raw = {**raw, "objectives": migrate.without_step_time(objectives)}
    settings = SpaceSettings.of(space_mod.parse_section(ResourcesSpec, raw, "resources", str(path)),
                                space_mod.parse_section(ObjectivesSpec, raw, "objectives", str(path)))
    if old:
        settings = SpaceSettings(settings.gpu_memory_gb, {**(settings.objectives or {}),
                                                          migrate.STEP_TIME: objectives[migrate.STEP_TIME]})
    return settings


def resolve_budget(memory_budget_gb: float | None, env: Mapping[str, Any] | None,
                   emulated_gb: float | None = None) -> tuple[float | None, str]:
    """The budget to use and where it came from: the flag; else the card the sweep emulated
    (space.yaml ``resources.gpu_memory_gb``); else the GPU's memory; else none."""
    if memory_budget_gb is not None:  # recommend() refuses a non-positive budget, whatever its source
        return float(memory_budget_gb), "--memory-budget-gb"
    if emulated_gb is not None:
        return float(emulated_gb), f"{ResultsDir.SPACE} resources.gpu_memory_gb (the emulated card)"
    from_env = migrate.gpu_memory_gb(env)
    if from_env is not None:
        return from_env, f"{ResultsDir.ENVIRONMENT} (the GPU's memory)"
    return None, "none"


def analyse(
    df: pd.DataFrame, memory_budget_gb: float | None, objectives: Mapping[str, Any] | None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN, budget_source: str = "--memory-budget-gb",
) -> tuple[pd.DataFrame, Recommendation, tuple[pareto.Objective, ...]]:
    """Frontier and recommendation for a loaded results frame (no I/O)."""
    objs = pareto.with_gpus(df, pareto.objectives_from_spec(objectives))
    analysed = pareto.analyse_frontier(df, objs)
    rec = recommend(analysed, memory_budget_gb, safety_margin=safety_margin, budget_source=budget_source,
                    objectives=objs)
    return analysed, rec, objs


def _analyse_results(out_dir: Path, memory_budget_gb: float | None, objectives: Mapping[str, Any] | None,
                     safety_margin: float, space: SpaceSettings | None):
    """DIR's results.csv analysed with the sweep's space settings (``space``, else DIR/space.yaml)
    and DIR/environment.json, as ``analyse_dir`` documents; returns (analysed, rec, objectives,
    environment)."""
    df = results.load_results(out_dir)
    env = results.load_environment(out_dir)
    space = space if space is not None else load_space_settings(out_dir)
    budget, source = resolve_budget(memory_budget_gb, env, space.gpu_memory_gb)
    spec = objectives if objectives is not None else space.objectives
    analysed, rec, objs = analyse(df, budget, spec, safety_margin, source)
    state = completeness(out_dir, df)
    rec = dataclasses.replace(rec, sweep_complete=state.complete, still_to_run=state.still_to_run)
    return analysed, rec, objs, env, space, state


def analyse_dir(out_dir: str | Path, memory_budget_gb: float | None = None,
                objectives: Mapping[str, Any] | None = None,
                safety_margin: float = DEFAULT_SAFETY_MARGIN,
                space: SpaceSettings | None = None, epochs: float = 1.0,
                other_cards: Sequence[Card] = (), trl: TrlFields | None = None,
                shapes: Mapping[ModelSpec, ModelShape] | None = None) -> AnalysisOutcome:
    """Analyse DIR/results.csv and (re)write frontier.md, recommendation.json, report.html.

    ``memory_budget_gb`` None: the space's emulated card, else the GPU's memory from
    environment.json, if any. ``objectives`` None: the space's ``objectives:``, else memory
    min, throughput max, loss std min. ``space``: the sweep's settings when the caller has parsed its space already
    (``dpo-sweep run``); None reads DIR/space.yaml. ``epochs`` and ``other_cards``: the run
    forecast's (:mod:`dpo_sweep.analysis.forecast`), in recommendation.json and the report.
    ``trl``: the TRL fields the winner is exported to; None: the installed TRL's, else the list
    recorded with the package. ``shapes``: the model shapes ``dpo-sweep run``'s preflight built (the
    memory model's, for the other trainer's predicted peak), so that its driver builds none.
    """
    from dpo_sweep.report.data import build_report_data
    from dpo_sweep.report.data_shape import load_data_json
    from dpo_sweep.report.html import write_report

    out_dir = Path(out_dir)
    files = ResultsDir(out_dir)
    analysed, rec, objs, env, space, state = _analyse_results(out_dir, memory_budget_gb, objectives, safety_margin, space)
    steps = results.load_steps(out_dir)
    winner = winner_of(out_dir, analysed, rec, space, trl, shapes)
    recommended_path = winner_mod.write_winner(out_dir, winner)

    table = tables.frontier_markdown(analysed)
    frontier_path = files.frontier
    floor = noise_floor.noise_floor_markdown(noise_floor.noise_floor(analysed, steps))
    pairs = trainer_switch.pairs_markdown(analysed)
    skipped = state.skipped_markdown()
    write_text_atomic(frontier_path, _frontier_document(table, objs, rec, analysed) + (f"\n{floor}" if floor else "")
                      + (f"\n{pairs}" if pairs else "") + (f"\n{skipped}" if skipped else ""))
    rec_json = rec.to_json_dict()
    rec_json["trl"] = winner.trl_json()
    datasets = load_data_json(out_dir)
    row = tables.row_of(analysed, rec.trial_id)
    fc, why = forecast_mod.forecast(row, datasets, epochs, env)
    estimates = forecast_mod.card_estimates(row, fc, env, other_cards, safety_margin)
    rec_json.update(forecast_mod.json_entry(fc, why, estimates))
    forecast_lines = forecast_mod.lines(fc, why, estimates)
    rec_path = files.recommendation
    write_text_atomic(rec_path, json.dumps(rec_json, indent=2, ensure_ascii=False) + "\n")
    report = build_report_data(analysed, rec, objs, steps, env, datasets, winner, state)
    report_path = write_report(files.report, dataclasses.replace(report, recommendation_json=rec_json,
                                                                 forecast=forecast_lines))
    winner_text = format_winner(winner, recommended_path)
    return AnalysisOutcome(table, report_path, frontier_path, rec_path, rec_json, analysed, objs,
                           format_recommendation(rec, report.bullets, report.banners) + winner_text,
                           recommended_path, winner_text,
                           "\n".join(forecast_lines), state)


def winner_of(out_dir: Path, analysed: pd.DataFrame, rec: Recommendation,
              space: SpaceSettings, trl: TrlFields | None = None,
              shapes: Mapping[ModelSpec, ModelShape] | None = None) -> winner_mod.Winner:
    """The recommended trial rebuilt from DIR/space.yaml (:mod:`dpo_sweep.analysis.winner`)."""
    row = tables.row_of(analysed, rec.trial_id)
    winner = winner_mod.winner_of(out_dir, row, space.objectives, trl)
    if winner.trl is None:
        return winner
    moved = trainer_switch.switch(analysed, row, trainer_switch.predicted_other_gb(winner.trial, row, shapes))
    return dataclasses.replace(winner, switch=trainer_switch.switch_text(row, moved), switch_data=moved)


def format_winner(winner: winner_mod.Winner, written: Path | None, write_command: str = "") -> str:
    """The winner as a file to run and as TRL arguments, for the console (empty: no winner).
    ``written``: where recommended.yaml is; None: not written, and ``write_command`` writes it."""
    if winner.trial is None:
        return f"\n  (no {ResultsDir.RECOMMENDED}: {winner.note})" if winner.note else ""
    where = (f"\n{ResultsDir.RECOMMENDED}: {written} (dpo-sweep validate / dpo-sweep trial it)" if written is not None
             else f"\n{ResultsDir.RECOMMENDED}: not written; `{write_command}` writes this one")
    return (f"{where}\nas TRL DPOConfig arguments:\n"
            + winner.trl_code())


def describe_objectives(objs: tuple[pareto.Objective, ...]) -> str:
    """``memory min, throughput max (read from the old step_time: min), loss_std min``."""
    return ", ".join(f"{o.name} {o.direction}" + (f" ({o.note})" if o.note else "") for o in objs)


def objective_notes(objs: tuple[pareto.Objective, ...]) -> list[str]:
    """One line per objective read other than as written (printed by report and recommend)."""
    return [migrate.objective_note_line(o.note, o.name, o.direction) for o in objs if o.note]


def _frontier_document(table: str, objs: tuple[pareto.Objective, ...], rec: Recommendation,
                       analysed: pd.DataFrame) -> str:
    objectives = describe_objectives(objs)
    source = tables.stability_source(analysed)
    return (f"# Pareto frontier\n\nObjectives: {objectives}. GB = 1e9 bytes. Sorted by peak memory; "
            "`on frontier` is `-` for trials that did not finish ok."
            + (f" {source}" if source else "") + "\n\n"
            f"{table}\n**Recommendation:** {rec.reason}\n")


def cmd_report(args: argparse.Namespace) -> int:
    """``dpo-sweep report DIR [--memory-budget-gb X]``."""
    outcome = analyse_dir(args.dir, args.memory_budget_gb,
                          safety_margin=safety_margin_of(args), epochs=epochs_of(args),
                          other_cards=getattr(args, "gpu", None) or ())
    for note in objective_notes(outcome.objectives):
        print(note)
    print(outcome.frontier_markdown)
    print(outcome.recommendation_text)
    print(outcome.forecast_text)
    if line := incomplete_line(outcome.completeness):
        print(line)
    print(f"wrote {outcome.frontier_path}, {outcome.recommendation_path}, {outcome.report_path}")
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    """``dpo-sweep recommend DIR --memory-budget-gb X [--write]``: print the choice; with
    ``--write``, write DIR/recommended.yaml for this budget (nothing else: report.html and
    recommendation.json stay the report's).

    Exit 0 also when nothing fits: that is an answer, and the message says so.
    """
    out_dir = Path(args.dir)
    analysed, rec, objs, _, space, state = _analyse_results(out_dir, args.memory_budget_gb, None,
                                                            safety_margin_of(args), None)
    for note in objective_notes(objs):
        print(note)
    winner = winner_of(out_dir, analysed, rec, space)
    written = winner_mod.write_winner(out_dir, winner) if getattr(args, "write", False) else None
    margin = "" if args.safety_margin is None else f" --safety-margin {args.safety_margin:g}"
    command = f"dpo-sweep recommend {out_dir} --memory-budget-gb {args.memory_budget_gb:g}{margin} --write"
    card = headline.headline_bullets(analysed, rec, objs), headline.banners(analysed, rec, state)
    print(format_recommendation(rec, *card) + format_winner(winner, written, command))
    if line := incomplete_line(state):
        print(line)
    return 0


def incomplete_line(state: Completeness) -> str:
    """The console's warning for a sweep that did not finish ("" when it did or cannot tell)."""
    missing, waiting = state.counts()
    if not missing and not waiting:
        return ""
    parts = ([f"{missing} configuration(s) without a row"] if missing else []) + (
        [f"{waiting} row(s) waiting for their stability (pending)"] if waiting else [])
    return (f"warning: the sweep did not finish: {' and '.join(parts)} ({ResultsDir.RECOMMENDATION} "
            "still_to_run); `dpo-sweep run SPACE --output DIR --resume` continues it")


def format_recommendation(rec: Recommendation, bullets: Sequence[str] = (), banners: Sequence[Banner] = ()) -> str:
    """The terminal answer: the configuration on the first lines, then the report's headline card
    (``bullets``) and its warnings (``banners``; the unfinished sweep's are incomplete_line's), and
    where the full reason is; without bullets (nothing recommended), the reason itself."""
    if rec.trial_id is None:
        head = "recommended: none (nothing fits)"
    else:
        c, m = rec.config, rec.metrics
        head = (f"recommended: {rec.trial_id}  micro_batch={c['micro_batch']} "
                f"checkpoint_level={c['checkpoint_level']} grad_acc={c['grad_acc']} "
                f"beta={tables.fmt_beta(c['beta'])}"
                + "".join(f" {k}={tables.fmt_setting(c.get(k))}" for k in tables.named_settings(rec)) + "\n"
                f"  peak {tables.fmt_float(m.get('peak_mem_gb'), 2)} GB, "
                f"{tables.fmt_float(m.get('step_time_ms'), 1)} ms/step, "
                f"{amount(m.get('tokens_per_s'))} tokens/s, "
                f"loss std {tables.fmt_sig(m.get('loss_std'))}")
    if rec.memory_budget_gb is not None:
        head += (f"\n  budget {rec.memory_budget_gb:.2f} GB ({rec.budget_source}), usable "
                 f"{rec.usable_memory_gb:.2f} GB after a {100 * rec.safety_margin:g}% safety margin; "
                 "GB = 1e9 bytes")
    if not bullets:
        return head + "\n" + rec.reason
    warnings = [f"warning: {b.text}" for b in banners if b.kind not in CONSOLE_UNFINISHED]
    return "\n".join([head, *(f"  - {b}" for b in bullets), *warnings,
                      f"  why, in full: {ResultsDir.RECOMMENDATION}'s reason (and {ResultsDir.REPORT})"])


def epochs_of(args: argparse.Namespace) -> float:
    """``--epochs`` of run and report (the CLI refuses a non-positive one); not given: 1."""
    epochs = getattr(args, "epochs", None)
    return 1.0 if epochs is None else float(epochs)


def safety_margin_of(args: argparse.Namespace) -> float:
    """``--safety-margin`` of run, report and recommend; not given: the default."""
    return DEFAULT_SAFETY_MARGIN if args.safety_margin is None else float(args.safety_margin)
