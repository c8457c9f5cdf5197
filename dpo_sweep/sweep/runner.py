"""``dpo-sweep run``: the whole sweep on a Ray cluster, one Tune trial per configuration.

The story: validate the space (exit 2 on a bad file) -> prepare the results directory (copy the
space file, keep or set aside earlier results) -> connect to Ray (a new local cluster with its
dashboard, or ``--address`` / ``RAY_ADDRESS``) and print where the dashboard is and how to log in
-> run the trials not yet in ``results.csv`` with ``tune.Tuner`` -> append each trial's rows to
``results.csv`` / ``steps.csv`` the moment it finishes (a killed sweep keeps every finished
trial; ``--resume`` skips them) -> analyse the directory and print the frontier table.

Exit codes: 0 the sweep finished (OOM and diverged trials are results), 1 infrastructure
failure (Ray could not start, Tune failed, a trial process died), 2 bad input.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray
from ray import tune

from dpo_sweep import preflight
from dpo_sweep.train.lengths import write_data_json
from dpo_sweep import space as space_mod
from dpo_sweep.analysis.results import STEPS_COLUMNS, TrialResult, read_csv_rows, write_results, write_steps
from dpo_sweep.config import TrialConfig
from dpo_sweep.errors import UserError
from dpo_sweep.sweep import driver

RESULTS_FILE = "results.csv"
STEPS_FILE = "steps.csv"


def say(line: str) -> None:
    """Progress output of the sweep (flushed: the sweep's output is often piped to a log)."""
    print(line, flush=True)


class InfrastructureError(RuntimeError):
    """Ray or Tune failed (not a trial's result): ``dpo-sweep run`` exits 1."""


# --- Results directory ------------------------------------------------------------------------


def default_output_dir(space_name: str) -> Path:
    return Path("reports") / space_name


def finished_trial_ids(out_dir: Path) -> set[str]:
    """Trial ids that already have a row in ``DIR/results.csv``."""
    return {r["trial_id"] for r in read_csv_rows(out_dir / RESULTS_FILE) if r.get("trial_id")}


def _drop_orphan_steps(out_dir: Path, keep_ids: set[str]) -> None:
    """A sweep killed between writing a trial's steps and its summary row leaves step rows of a
    trial that will run again: drop them so that steps.csv holds every trial exactly once."""
    path = out_dir / STEPS_FILE
    rows = read_csv_rows(path)
    kept = [r for r in rows if r.get("trial_id") in keep_ids]
    if len(kept) == len(rows):
        return
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=STEPS_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(kept)


def prepare_output(space_path: Path, out_dir: Path, resume: bool) -> set[str]:
    """Create ``out_dir``, copy the space file to ``DIR/space.yaml`` and return the trial ids to
    skip. Without ``--resume`` earlier results are moved to ``DIR/previous-<time>/``, not lost."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    if resume:
        done = finished_trial_ids(out_dir)
        _drop_orphan_steps(out_dir, done)
    else:
        old = [p for p in (out_dir / RESULTS_FILE, out_dir / STEPS_FILE) if p.exists()]
        if old:
            aside = out_dir / time.strftime("previous-%Y%m%d-%H%M%S")
            aside.mkdir(exist_ok=True)
            for p in old:
                shutil.move(str(p), aside / p.name)
            print(f"earlier results moved to {aside} (use --resume to continue a sweep instead)")
    target = out_dir / "space.yaml"
    if space_path.resolve() != target.resolve():
        shutil.copyfile(space_path, target)
    return done


def _absolute_paths(cfg: TrialConfig) -> TrialConfig:
    """Tune runs each trial in its own working directory: make local data/model paths absolute."""
    updates: dict[str, Any] = {}
    if cfg.data.path and not os.path.isabs(cfg.data.path) and os.path.exists(cfg.data.path):
        updates["data"] = cfg.data.model_copy(update={"path": os.path.abspath(cfg.data.path)})
    name = cfg.model.name_or_path
    if name and not os.path.isabs(name) and os.path.exists(name):
        updates["model"] = cfg.model.model_copy(update={"name_or_path": os.path.abspath(name)})
    return cfg.model_copy(update=updates) if updates else cfg


# --- Ray connection ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RayConnection:
    dashboard_url: str | None
    token_auth: bool
    started_here: bool  # ray.init() was called by this run (so this run shuts it down)


def _token_auth_enabled() -> bool:
    try:  # private module; token auth exists from Ray 2.52 and is on by default for local clusters from 2.59
        from ray._private.authentication.authentication_utils import is_token_auth_enabled

        return bool(is_token_auth_enabled())
    except Exception:  # noqa: BLE001 - older Ray: no token auth
        return False


#: Ray Train settings for short trials (a user's own environment variables win). Measured on 2
#: CPU cores with 3 tiny trials: 73 s -> 48 s for the sweep, about 8 s less per trial.
#: - the controller polls the worker group every 2 s by default: a finished trial waited for it;
#: - the preemption watcher (for spot instances) polls every 5 s and held ``fit()`` back as long.
#: - Train's print patch echoed every line of the trainer's progress twice on the console.
RAY_TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


def _ray_env() -> dict[str, str]:
    """RAY_TRAIN_ENV, less what the user set; also exported here, so a local cluster started by
    this process inherits it, and passed as the job's runtime_env for an existing cluster."""
    env = {k: v for k, v in RAY_TRAIN_ENV.items() if k not in os.environ}
    os.environ.update(env)
    return env


def connect_ray(address: str | None, dashboard: bool) -> RayConnection:
    """Join ``address`` (or ``RAY_ADDRESS``) or start a new local cluster; reuse this process's
    connection when it already has one (a notebook, or a caller that ran ``ray.init``)."""
    if ray.is_initialized():
        url = ray._private.worker.get_dashboard_url() if dashboard else None  # noqa: SLF001
        return RayConnection(_with_scheme(url), _token_auth_enabled(), started_here=False)
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        runtime_env = {"env_vars": _ray_env(),
                       "worker_process_setup_hook": "dpo_sweep.sweep.worker_setup.quiet_ray_train_logs"}
        if address:
            ctx = ray.init(address=address, runtime_env=runtime_env)
        else:
            # "local": always a new cluster. A bare ray.init() would join whatever cluster
            # `ray start` last recorded in /tmp/ray (and hang if that one is gone).
            ctx = ray.init(address="local", include_dashboard=dashboard, runtime_env=runtime_env)
    except Exception as err:  # noqa: BLE001
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise InfrastructureError(f"could not connect to {where}: {err}") from err
    url = getattr(ctx, "dashboard_url", None) if dashboard or address else None
    return RayConnection(_with_scheme(url), _token_auth_enabled(), started_here=True)


def _with_scheme(url: str | None) -> str | None:
    if not url:
        return None
    return url if url.startswith("http") else f"http://{url}"


def print_dashboard(conn: RayConnection, out: Callable[[str], None] = say) -> None:
    if not conn.dashboard_url:
        out("Ray dashboard: off (--no-dashboard, or the cluster runs without one)")
        return
    out(f"Ray dashboard: {conn.dashboard_url}  (Train and Tune progress, logs, per-node CPU/GPU/memory)")
    if conn.token_auth:
        out("  token authentication is on: the dashboard asks for the cluster's token. Print it with "
            "`ray get-auth-token` (stored in ~/.ray/auth_token unless RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH is set); REST clients send `Authorization: Bearer <token>`.")


def resolve_use_gpu(setting: Any, cluster_gpus: float) -> bool:
    if setting == "auto":
        return cluster_gpus > 0
    if setting and cluster_gpus <= 0:
        raise UserError("resources.use_gpu: true, but the Ray cluster has no GPUs; use "
                        "use_gpu: auto or false, or join a GPU cluster with --address")
    return bool(setting)


def default_max_concurrent(use_gpu: bool, cluster_gpus: float, workers_per_trial: int) -> int:
    """All GPUs busy with one trial per ``workers_per_trial`` GPUs; on CPU one trial at a time
    (concurrent CPU trials would share cores and spoil each other's step times)."""
    if not use_gpu:
        return 1
    return max(1, int(cluster_gpus // workers_per_trial))


def check_fits(cfg: TrialConfig, cluster_cpus: float) -> None:
    need = cfg.resources.workers_per_trial * cfg.resources.cpus_per_worker + driver.TRIAL_CPUS
    if need > cluster_cpus + 1e-9:
        raise UserError(
            f"resources: a trial needs {need:g} CPUs ({cfg.resources.workers_per_trial} workers x "
            f"cpus_per_worker {cfg.resources.cpus_per_worker:g} + {driver.TRIAL_CPUS:g} for the trial) "
            f"but the Ray cluster has {cluster_cpus:g}; lower resources.cpus_per_worker or "
            "resources.workers_per_trial")


# --- Tune callback: rows as each trial finishes -------------------------------------------


def progress_line(index: int, total: int, result: TrialResult) -> str:
    def num(x: float, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-"

    line = (f"[{index}/{total}] {result.trial_id:<32} {result.status:<8} "
            f"peak {num(result.peak_mem_gb, '.2f')} GB  step {num(result.step_time_ms, '.0f')} ms  "
            f"startup {num(result.startup_s, '.1f')} s")
    if result.error:
        line += f"  | {result.error[:120]}"
    return line


class SweepRecorder(tune.Callback):
    """A Tune callback (driver process) that appends each finished trial to the CSVs and prints
    its progress line. Output goes through the module-level :func:`say` (a picklable reference:
    Tune pickles its callbacks with the experiment state)."""

    def __init__(self, out_dir: Path, total: int, already_done: int) -> None:
        self.out_dir = out_dir
        self.total = total
        self.collector = driver.TrialCollector()
        self.finished = already_done
        self.written: set[str] = set()
        self.crashed: list[str] = []
        self.worker_environment_written = False

    @staticmethod
    def _cfg(trial: Any) -> TrialConfig:
        return TrialConfig.model_validate(trial.config["trial"])

    def _write(self, done: driver.CollectedTrial) -> None:
        if done.result.trial_id in self.written:
            return
        self.written.add(done.result.trial_id)
        # Steps first: a kill between the two writes leaves orphan steps, which --resume drops.
        write_steps(self.out_dir, done.steps, append=True)
        write_results(self.out_dir, [done.result], append=True)
        if done.environment and not self.worker_environment_written:
            # The workers' machine, not the driver's: replaces the driver-side environment.json.
            _write_environment(self.out_dir, say, done.environment)
            self.worker_environment_written = True
        self.finished += 1
        say(progress_line(self.finished, self.total, done.result))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        done = self.collector.add(trial.trial_id, self._cfg(trial), result)
        if done is not None:
            self._write(done)

    def on_trial_error(self, iteration, trials, trial, **info):
        cfg = self._cfg(trial)
        if cfg.trial_id in self.written:
            return
        self.crashed.append(cfg.trial_id)
        err = getattr(trial, "error_msg", None) or "the Tune trial process failed"
        self._write(self.collector.abandon(trial.trial_id, cfg, str(err)))


# --- The sweep ------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    out_dir: Path
    ran: int
    skipped: int
    crashed: list[str] = field(default_factory=list)


def _trial_dirname(trial: Any) -> str:
    return trial.config["trial"]["trial_id"]


def tune_config(max_concurrent: int) -> tune.TuneConfig:
    return tune.TuneConfig(
        max_concurrent_trials=max_concurrent,
        # The trial process only waits on fit() and never touches a GPU: keeping it saves a
        # process start and its imports per trial (the Train workers are still new every trial).
        reuse_actors=True,
        trial_dirname_creator=_trial_dirname,
    )


def run_sweep(sp: space_mod.Space, out_dir: Path, *, max_concurrent: int | None, done_ids: set[str],
              cluster: dict[str, float], trainer: str = driver.DEFAULT_TRAINER,
              out: Callable[[str], None] = say) -> SweepSummary:
    """Run the space's trials that are not in ``done_ids`` on the connected Ray cluster."""

    todo = [_absolute_paths(t) for t in sp.trials if t.trial_id not in done_ids]
    total = len(sp.trials)
    if done_ids:
        out(f"resume: {total - len(todo)} of {total} trial(s) already in {out_dir / RESULTS_FILE}")
    if not todo:
        return SweepSummary(out_dir, ran=0, skipped=total)
    cluster_gpus = float(cluster.get("GPU", 0))
    use_gpu = resolve_use_gpu(sp.spec.resources.use_gpu, cluster_gpus)
    check_fits(todo[0], float(cluster.get("CPU", 0)))
    workers = sp.spec.resources.workers_per_trial
    concurrent = max_concurrent or default_max_concurrent(use_gpu, cluster_gpus, workers)
    out(f"{len(todo)} trial(s) to run, {concurrent} at a time, {workers} worker(s) each on "
        f"{'GPU' if use_gpu else 'CPU'}; results go to {out_dir}/")

    storage = str((out_dir / "ray").resolve())
    recorder = SweepRecorder(out_dir, total, total - len(todo))
    try:
        tuner = tune.Tuner(
            tune.with_resources(driver.tune_trainable, {"CPU": driver.TRIAL_CPUS}),
            param_space={
                "trial": tune.grid_search([t.model_dump(mode="json") for t in todo]),
                "use_gpu": use_gpu,
                "storage_path": storage,
                "trainer": trainer,
            },
            tune_config=tune_config(concurrent),
            run_config=tune.RunConfig(
                name=time.strftime(f"{sp.name}-%Y%m%d-%H%M%S"),
                storage_path=storage,
                callbacks=[recorder],
                failure_config=tune.FailureConfig(max_failures=0),
                verbose=0,
            ),
        )
        tuner.fit()
    except Exception as err:  # noqa: BLE001
        raise InfrastructureError(f"Ray Tune failed: {type(err).__name__}: {err}") from err
    missing = [t.trial_id for t in todo if t.trial_id not in recorder.written]
    if missing:
        raise InfrastructureError(
            f"Tune ended without a result for {len(missing)} trial(s) ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); if the sweep was interrupted, run the same "
            "command with --resume to run only those")
    return SweepSummary(out_dir, ran=len(todo), skipped=total - len(todo), crashed=recorder.crashed)


def _write_environment(out_dir: Path, out: Callable[[str], None],
                       info: dict[str, Any] | None = None) -> None:
    try:
        from dpo_sweep.telemetry import write_environment
    except ImportError as err:
        out(f"note: environment.json not written ({err})")
        return
    try:
        write_environment(out_dir, info)
    except Exception as err:  # noqa: BLE001 - a missing GPU library must not stop the sweep
        out(f"note: environment.json not written ({type(err).__name__}: {err})")


def _analyse(out_dir: Path, args: argparse.Namespace, out: Callable[[str], None]) -> None:
    """What ``dpo-sweep report DIR`` does, on the directory just written: the objectives come from
    DIR/space.yaml, the copy of the space file (so the two commands always agree)."""
    try:
        from dpo_sweep.analysis.commands import analyse_dir, safety_margin_of
    except ImportError as err:
        out(f"note: the analyser is not available ({err}); results are in {out_dir}/, "
            f"analyse them later with `dpo-sweep report {out_dir}`")
        return
    try:
        analysis = analyse_dir(out_dir, memory_budget_gb=args.memory_budget_gb,
                               safety_margin=safety_margin_of(args))
    except Exception as err:  # noqa: BLE001 - the sweep's results are safe on disk either way
        out(f"note: analysis failed ({type(err).__name__}: {err}); results are in {out_dir}/, "
            f"retry with `dpo-sweep report {out_dir}`")
        return
    out("")
    out(str(analysis.frontier_markdown).rstrip())
    out("")
    out(f"report: {analysis.report_path}")


def cmd_run(args: argparse.Namespace) -> int:
    """``dpo-sweep run SPACE.yaml``: see the module doc for the steps and exit codes."""
    sp = space_mod.load(args.space)  # UserError -> exit 2, before anything starts
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UserError(f"--max-concurrent: {args.max_concurrent} is not allowed; give 1 or more")
    out_dir = Path(args.output) if args.output else default_output_dir(sp.name)
    data = preflight.check_inputs(sp.trials, out_dir)  # exit 2 before Ray
    say("\n".join(s.line() for s in data))
    done_ids = prepare_output(Path(args.space), out_dir, resume=bool(args.resume))
    _write_environment(out_dir, say)
    write_data_json(out_dir, [s.shape for s in data if s.shape is not None])  # the report's data shape

    if done_ids >= {t.trial_id for t in sp.trials}:
        say(f"resume: all {len(sp.trials)} trial(s) are already in {out_dir / RESULTS_FILE}; nothing to run")
        _analyse(out_dir, args, say)
        return 0

    conn: RayConnection | None = None
    try:
        conn = connect_ray(args.address, dashboard=not args.no_dashboard)
        print_dashboard(conn, say)
        summary = run_sweep(sp, out_dir, max_concurrent=args.max_concurrent, done_ids=done_ids,
                            cluster=ray.cluster_resources())
    except InfrastructureError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if conn is not None and conn.started_here:
            ray.shutdown()
    say(f"sweep finished: {summary.ran} trial(s) run, {summary.skipped} skipped; "
        f"results in {out_dir / RESULTS_FILE}")
    _analyse(out_dir, args, say)
    if summary.crashed:
        print(f"error: {len(summary.crashed)} trial process(es) died (not OOM or divergence: an "
              f"infrastructure failure): {', '.join(summary.crashed)}", file=sys.stderr)
        return 1
    return 0
