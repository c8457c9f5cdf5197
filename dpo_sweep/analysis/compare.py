"""Two sweeps side by side, as data and as the text ``dpo-sweep compare DIR1 DIR2`` prints
(:mod:`dpo_sweep.commands.compare`).

The configurations both folders measured (matched by their settings, not their ids: the ids of
two spaces differ when their value lists do), each one's peak memory and tokens/s in both runs and
the change; what only one of them has; and what changed between the runs: the recommendation, the
space's settings (``space.yaml``) and the machine (``environment.json``). Reads only; writes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dpo_sweep import space as space_mod
from dpo_sweep.analysis import results, tables
from dpo_sweep.analysis.completeness import LEVER_DEFAULTS
from dpo_sweep.core.dimensions import CONFIG_COLUMNS, LEVER_COLUMNS
from dpo_sweep.results_dir import ResultsDir

#: The settings that identify a configuration in both folders (the swept columns are added).
KEY_COLUMNS = (*CONFIG_COLUMNS, *LEVER_COLUMNS)
#: environment.json keys that differ from run to run on one machine (not worth a line).
_VOLATILE_ENV = ("host", "hostname", "collected_at_utc", "pid")


@dataclass(frozen=True)
class Comparison:
    """What ``compare`` prints, as data."""

    header: tuple[str, ...]
    rows: list[list[str]]
    only_first: list[str]
    """Configurations (the first folder's short ids) the second folder lacks."""
    only_second: list[str]
    changes: list[str]
    """What changed between the runs, one line each."""


def key_columns(first: pd.DataFrame, second: pd.DataFrame) -> list[str]:
    """The settings both folders carry, the swept columns of either included."""
    swept = dict.fromkeys(tables.varying_columns(first) + tables.varying_columns(second))
    return [c for c in dict.fromkeys([*KEY_COLUMNS, *swept]) if c in first and c in second]


def _keys(df: pd.DataFrame, columns: list[str]) -> list[tuple[str, ...]]:
    out = []
    for _, r in df.iterrows():
        values = [tables.fmt_setting(r.get(c)) for c in columns]
        out.append(tuple(LEVER_DEFAULTS.get(c, v) if v == "-" else v for c, v in zip(columns, values)))
    return out


def _change(a: Any, b: Any) -> str:
    if not (tables.is_finite(a) and tables.is_finite(b)) or float(a) == 0:
        return "-"
    return tables.signed_pct(100.0 * (float(b) - float(a)) / float(a))


def _flat(mapping: dict[str, Any] | None, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (mapping or {}).items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(_flat(value, name))
        else:
            out[name] = str(value)
    return out


def _differences(label: str, a: dict[str, str], b: dict[str, str], skip: tuple[str, ...] = ()) -> list[str]:
    keys = [k for k in dict.fromkeys([*a, *b]) if not any(part in skip for part in k.split("."))]
    return [f"{label} {k}: {a.get(k, '(absent)')} -> {b.get(k, '(absent)')}" for k in keys if a.get(k) != b.get(k)]


def _space(path: Path) -> dict[str, str]:
    file = ResultsDir(path).space
    return _flat(space_mod.load_raw(file)) if file.is_file() else {}


def _recommendation(path: Path) -> str:
    file = ResultsDir(path).recommendation
    if not file.is_file():
        return "(none written)"
    rec = json.loads(file.read_text(encoding="utf-8"))
    config = rec.get("config") or {}
    settings = ", ".join(f"{k} {tables.fmt_setting(v)}" for k, v in config.items()
                         if k in ("micro_batch", "checkpoint_level", "grad_acc", "beta", "adapter", "optimizer"))
    return f"{rec.get('trial_id')} ({settings})" if rec.get("trial_id") else "nothing fits"


def compare(first_dir: str | Path, second_dir: str | Path) -> Comparison:
    """The two folders side by side (see the module doc)."""
    first_dir, second_dir = Path(first_dir), Path(second_dir)
    first, second = tables.memory_order(results.load_results(first_dir)), results.load_results(second_dir)
    columns = key_columns(first, second)
    by_key = {k: r for k, (_, r) in zip(_keys(second, columns), second.iterrows())}
    swept = [c for c in columns if c not in ("model", "seq_len") and
             pd.concat([first[c], second[c]]).astype(str).nunique() > 1]
    header = ("trial (1)", "trial (2)", *swept, "status (1)", "status (2)", "peak GB (1)", "peak GB (2)", "change",
              "tokens/s (1)", "tokens/s (2)", "change")
    rows, only_first, matched = [], [], set()
    for key, (_, a) in zip(_keys(first, columns), first.iterrows()):
        b = by_key.get(key)
        if b is None:
            only_first.append(tables.short_id(str(a["trial_id"])))
            continue
        matched.add(key)
        rows.append([tables.short_id(str(a["trial_id"])), tables.short_id(str(b["trial_id"])),
                     *[tables.fmt_setting(a.get(c)) for c in swept], str(a["status"]), str(b["status"]),
                     tables.fmt_float(a["peak_mem_gb"], 2), tables.fmt_float(b["peak_mem_gb"], 2),
                     _change(a["peak_mem_gb"], b["peak_mem_gb"]),
                     tables.fmt_sig(a["tokens_per_s"], 4), tables.fmt_sig(b["tokens_per_s"], 4),
                     _change(a["tokens_per_s"], b["tokens_per_s"])])
    only_second = [tables.short_id(str(r["trial_id"])) for k, (_, r) in zip(_keys(second, columns), second.iterrows())
                   if k not in matched]
    changes = []
    rec_a, rec_b = _recommendation(first_dir), _recommendation(second_dir)
    changes.append(f"recommendation: {rec_a} -> {rec_b}" if rec_a != rec_b else f"recommendation: the same, {rec_a}")
    changes += _differences("space", _space(first_dir), _space(second_dir))
    changes += _differences("machine", _flat(results.load_environment(first_dir)),
                            _flat(results.load_environment(second_dir)), _VOLATILE_ENV)
    return Comparison(header, rows, only_first, only_second, changes)


def format_comparison(c: Comparison, first_dir: str, second_dir: str) -> str:
    """The console text: the matched configurations as a markdown table, then what differs."""
    lines = [f"(1) {first_dir}", f"(2) {second_dir}", "",
             f"{len(c.rows)} configuration(s) in both (matched by their settings; GB = 1e9 bytes):", ""]
    lines.append(tables.to_markdown(c.header, c.rows) if c.rows else "(none in common)\n")
    if c.only_first:
        lines.append(f"only in (1): {', '.join(c.only_first)}")
    if c.only_second:
        lines.append(f"only in (2): {', '.join(c.only_second)}")
    lines += ["", "what changed between the runs:"] + [f"  {line}" for line in c.changes]
    return "\n".join(lines)
