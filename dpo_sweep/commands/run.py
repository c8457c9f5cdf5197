"""``dpo-sweep run``: the whole sweep on a Ray cluster, through the planner (fewer Tune trials
than configurations; ``--full-grid``: one per configuration).

The story: validate the space (exit 2 on a bad file) -> check the files it names (exit 2) -> start
Ray and the warm workers (:mod:`~dpo_sweep.sweep.ray_cluster`: a new local cluster with its
dashboard, or ``--address`` / ``RAY_ADDRESS``), then import Tune, while the tokenizers, the
tokenised data and the memory model's shapes are checked in a process of their own
(:mod:`~dpo_sweep.preflight`, exit 2; :mod:`~dpo_sweep.sweep.startup`: this process never imports
torch or transformers) -> prepare the results directory
(:mod:`~dpo_sweep.sweep.output_dir`: copy the space file, keep or set aside earlier results) ->
print where the dashboard is and how to log in -> run the
trials not yet in ``results.csv`` (:mod:`~dpo_sweep.sweep.tuner`), each trial's rows appended as it
finishes (:mod:`~dpo_sweep.sweep.recorder`), its workers' output in ``DIR/logs/`` -> analyse the
directory and print the frontier table and the recommendation, while the warm workers and Ray
shut down beside it (:class:`RayRelease`). Ctrl-C and a failure that every
trial meets the same way end the sweep early (:mod:`~dpo_sweep.sweep.stopping`).

A command, the top layer: it imports the sweep's producers and, at its end, the analyser
(:mod:`~dpo_sweep.commands.report`, what ``dpo-sweep report`` does).

Exit codes: 0 the sweep finished (OOM and diverged trials are results), 1 infrastructure
failure (Ray could not start, Tune failed, a trial timed out or its process died: the last line
says how many), the final analysis failed (its stale files removed) or the first trials all failed
the same way before their first step, 2 bad input, 130 Ctrl-C (finished rows kept).
"""
from __future__ import annotations

import argparse
import gc
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import ray
import yaml

from dpo_sweep import preflight
from dpo_sweep.core import trial_facts
from dpo_sweep.core.lengths import write_data_json
from dpo_sweep import space as space_mod
from dpo_sweep.errors import UserError, os_error_line
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.text import excerpt
from dpo_sweep.sweep.console import say
from dpo_sweep.sweep.folder_lock import FolderLock
from dpo_sweep.sweep.local_cluster import stop_guard
from dpo_sweep.sweep.output_dir import default_output_dir, finished_trial_ids, prepare_output, save_environment
from dpo_sweep.sweep.resume import match_rows, renamed_ids
from dpo_sweep.sweep.ray_cluster import (InfrastructureError, RayConnection, connect_ray, print_dashboard,
                                         stop_local_autoscaler)
from dpo_sweep.sweep import signals, warm_worker
from dpo_sweep.sweep.slots import TrialSlots, absolute_paths, start_warm_workers, trial_slots
from dpo_sweep.sweep.startup import BackgroundPreflight, CheckedInputs

if TYPE_CHECKING:
    from dpo_sweep.config import ModelSpec, TrialConfig
    from dpo_sweep.plan.shape import ModelShape
    from dpo_sweep.sweep.tuner import SweepSummary
    from dpo_sweep.core.lengths import LengthProfile


def import_tune() -> None:
    """Tune and the sweep's Tune side (:mod:`~dpo_sweep.sweep.tuner`; most of a second), imported
    once Ray is up and the warm workers import: not before ``ray.init``, which waited for them."""
    import dpo_sweep.sweep.tuner  # noqa: F401


def run_sweep(sp: space_mod.Space, out_dir: Path, *, trials: Sequence[TrialConfig], slots: TrialSlots,
              done_ids: set[str], full_grid: bool, lengths: Mapping[str, LengthProfile | None],
              shapes: Mapping[ModelSpec, ModelShape], pool: warm_worker.WarmPool | None,
              trial_timeout_floor_s: float, on_rows: Callable[[], None] | None = None) -> SweepSummary:
    """:func:`dpo_sweep.sweep.tuner.run_sweep`, imported when called (see :func:`import_tune`)."""
    from dpo_sweep.sweep.tuner import run_sweep as run

    return run(sp, out_dir, trials=trials, slots=slots, done_ids=done_ids, full_grid=full_grid,
               lengths=lengths, shapes=shapes, pool=pool, trial_timeout_floor_s=trial_timeout_floor_s,
               on_rows=on_rows)


def _stopping() -> Any:
    from dpo_sweep.sweep import stopping  # imports Tune: only when a sweep stops, or Ctrl-C

    return stopping


def _analyse(out_dir: Path, args: argparse.Namespace, out: Callable[[str], None],
             spec: space_mod.SweepSpace | None = None, checked: CheckedInputs | None = None) -> int:
    """What ``dpo-sweep report DIR`` does, on the directory just written: the objectives and the
    emulated card come from ``spec``, the space this run validated (DIR/space.yaml is its copy,
    so the two commands agree); without it, from DIR/space.yaml. ``checked``: the preflight's
    answer, whose TRL fields and model shapes the analysis takes (this process imports neither
    TRL nor torch)."""
    try:
        from dpo_sweep.commands.report import analyse_dir
    except ImportError as err:
        out(f"note: the analyser is not available ({err}); results are in {out_dir}/, "
            f"analyse them later with `dpo-sweep report {out_dir}`")
        return 0
    try:
        analysis = analyse_dir(out_dir, **_analysis_settings(args, spec, checked))
    except OSError as err:  # a full disk: the sweep's rows are whole, the analysis files are not written
        print(f"error: the analysis could not be written ({os_error_line(err)}); the results are in {out_dir}/. "
              f"Once fixed: dpo-sweep report {out_dir}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - the sweep's results are safe on disk either way
        stale = [p.name for p in ResultsDir(out_dir).analysis_files if p.is_file()]
        for path in ResultsDir(out_dir).analysis_files:
            path.unlink(missing_ok=True)  # they described earlier rows: no reader may take them for these
        cause = excerpt(" ".join(str(err).split()), 300)
        print(f"error: the analysis failed ({type(err).__name__}: {cause}); the rows are in {out_dir}/"
              + (f", the earlier {', '.join(stale)} removed" if stale else "")
              + f". Once fixed: dpo-sweep report {out_dir}", file=sys.stderr)
        return 1
    out("")
    out(str(analysis.frontier_markdown).rstrip())
    out("")
    out(analysis.recommendation_text)
    out(analysis.forecast_text)
    out("")
    out(f"report: {analysis.report_path}")
    return 0


def _analysis_settings(args: argparse.Namespace, spec: space_mod.SweepSpace | None,
                       checked: CheckedInputs | None) -> dict[str, Any]:
    """``analyse_dir``'s settings of this run (its flags, the space it validated, the preflight's
    TRL fields and model shapes): the final analysis's and the live report's."""
    from dpo_sweep.commands.report import SpaceSettings, epochs_of, safety_margin_of

    return {"memory_budget_gb": args.memory_budget_gb, "safety_margin": safety_margin_of(args),
            "space": SpaceSettings.from_space(spec) if spec is not None else None, "epochs": epochs_of(args),
            "other_cards": getattr(args, "gpu", None) or (), "trl": checked.trl if checked else None,
            "shapes": checked.shapes if checked else None}


class LiveReport:
    """The analysis files (report.html first among them) rewritten from the rows written so far,
    while the sweep runs: at most once every ``every_s`` seconds from the sweep's start (0: never),
    so that a browser tab on DIR/report.html can be refreshed mid-sweep. Its report says the sweep
    has not finished (the "incomplete" banner). A failure says one note and stops the rewrites; the
    final analysis runs as ever."""

    def __init__(self, out_dir: Path, args: argparse.Namespace, spec: space_mod.SweepSpace,
                 checked: CheckedInputs, every_s: float, clock: Callable[[], float] | None = None) -> None:
        self.out_dir, self.args, self.spec, self.checked = out_dir, args, spec, checked
        self.every_s = every_s
        self.clock = clock or time.monotonic
        self.last = self.clock()
        self.written = 0
        self.failed = False

    def __call__(self) -> None:
        now = self.clock()
        if self.failed or self.every_s <= 0 or now - self.last < self.every_s:
            return
        self.last = now
        from dpo_sweep.commands.report import analyse_dir

        try:
            analyse_dir(self.out_dir, **_analysis_settings(self.args, self.spec, self.checked))
        except Exception as err:  # noqa: BLE001 - the rows are on disk; the final analysis runs anyway
            self.failed = True
            say(f"note: {ResultsDir.REPORT} could not be rewritten mid-sweep ({type(err).__name__}: "
                f"{excerpt(' '.join(str(err).split()), 200)}); it is written when the sweep ends")
            return
        if not self.written:
            say(f"  report so far: {ResultsDir(self.out_dir).report} (rewritten at most every "
                f"{self.every_s:g} s while the sweep runs; --report-every-s)")
        self.written += 1


def _stopped_early(summary: SweepSummary, args: argparse.Namespace, out_dir: Path, total: int) -> int:
    """The exit of a sweep that ``stopping`` ended: its one line, and no analysis (what did not run
    is not a result; ``dpo-sweep report DIR`` analyses the rows there are)."""
    stopping = _stopping()
    if summary.write_error is not None:
        print(f"error: {summary.write_error}; the sweep stopped, the rows written before are kept. Once fixed, "
              f"continue with: {stopping.resume_command(args.space, str(out_dir), args.overrides)}", file=sys.stderr)
        return 1
    if summary.stopped == stopping.INTERRUPTED:
        say(stopping.interrupted_line(summary.finished, total, stopping.resume_command(args.space, str(out_dir), args.overrides)))
        return signals.exit_code(summary.signum)
    print(f"error: the first {summary.ran} trial(s) all failed "
          f"before their first step with the same cause; the sweep stopped, "
          f"{len(summary.not_run)} trial(s) not run. Their rows and logs: {ResultsDir(out_dir).results}, "
          f"{ResultsDir(out_dir).logs}/. The cause: {summary.stopped}", file=sys.stderr)
    return 1


def _space_record(args: argparse.Namespace, sp: space_mod.Space) -> str | None:
    """DIR/space.yaml's text when ``--set`` changed the file's settings: the ones the sweep ran,
    which ``dpo-sweep report`` reads there; None: a copy of the file."""
    if not args.overrides:
        return None
    sets = " ".join(f"--set {shlex.quote(item)}" for item in args.overrides)
    return f"# {args.space} with {sets}\n" + yaml.safe_dump(sp.raw, sort_keys=False)


def simulation_decided(trials: Sequence[TrialConfig], cluster: dict, slots: TrialSlots) -> list[TrialConfig]:
    """``trials`` with ``resources.simulate_ranks: auto`` decided for the connected cluster
    (core/trial_facts.resolve_simulation), said in the console where it simulates."""
    gpus = float(cluster.get("GPU", 0))
    decided = [trial_facts.resolve_simulation(t, gpus, slots.use_gpu) for t in trials]
    chose = sorted({t.resources.workers_per_trial for t, was in zip(decided, trials)
                    if trial_facts.ranks_simulated(t) and was.resources.simulate_ranks == "auto"})
    if chose:
        say(f"resources.simulate_ranks auto: the cluster has {gpus:g} GPU(s), fewer than trials of "
            f"{', '.join(map(str, chose))} workers ask for: those run as rank 0 alone on one GPU through the fake "
            "process group (ranks_simulated; per-GPU peaks measured, step time modelled); "
            "--simulate-ranks false refuses instead")
    return decided


#: How often the live report is rewritten while a sweep runs, unless --report-every-s says.
DEFAULT_REPORT_EVERY_S = 60.0


def _report_every_s(args: argparse.Namespace) -> float:
    """``--report-every-s`` (DEFAULT_REPORT_EVERY_S when not given; 0: no live report)."""
    value = getattr(args, "report_every_s", None)
    return DEFAULT_REPORT_EVERY_S if value is None else value


def _timeout_floor(args: argparse.Namespace) -> float:
    """``--trial-timeout-s`` (stopping.DEFAULT_TRIAL_TIMEOUT_FLOOR_S when not given)."""
    value = getattr(args, "trial_timeout_s", None)
    return _stopping().DEFAULT_TRIAL_TIMEOUT_FLOOR_S if value is None else value


def _prepare(args: argparse.Namespace, out_dir: Path, checked: CheckedInputs, sp: space_mod.Space,
             renamed: dict[str, str]) -> set[str]:
    """After the preflight: its lines and notes, the results directory (earlier results kept or set aside),
    environment.json (the preflight's look at this machine) and data.json; the trial ids to skip."""
    say("\n".join(line for s in checked.data for line in (s.line(), *s.notes())))
    for note in checked.notes:
        say(note)
    done_ids = prepare_output(Path(args.space), out_dir, resume=bool(args.resume), renamed=renamed,
                              space_text=_space_record(args, sp))
    save_environment(out_dir, say, checked.environment)
    write_data_json(out_dir, [s.shape for s in checked.data if s.shape is not None])  # the report's data shape
    return done_ids


class RayRelease:
    """Ends the sweep's warm workers and the local Ray it started, in a thread, so that what the
    command does after its trials (the analysis and the report) runs beside Ray's shutdown (the
    autoscaler's monitor stopped first, :func:`stop_local_autoscaler`; each takes about half a
    second: benchmarks/README.md#start-up-and-shutdown) instead of after it. Leaving the ``with`` block
    waits for it (and starts it if nothing did): the command never returns with Ray still up.

    While Ray shuts down, no Ray handle may be freed in this process: an actor handle or object
    ref whose ``__del__`` reaches the core worker mid-shutdown ends the process with exit 1 ("The
    core worker has already been shutdown"), after a sweep that finished. Seen on the CPU: a
    checkpoint-folder sweep of 2,000 pairs, 3 runs of 3. So the release holds the pool and the
    connection until Ray is down, and the cyclic garbage collector, which would free the Tune
    run's handles at any allocation, waits until then too."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._held: tuple[Any, ...] = ()
        self._gc_was_enabled = False

    def start(self, pool: warm_worker.WarmPool | None, conn: RayConnection | None) -> None:
        self._held = (pool, conn)
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        def release() -> None:
            if pool is not None:
                pool.close()  # the workers' GPUs are free again
            # A local cluster with everything in it; on a joined cluster, the job's trial actors
            # (their Train controllers and workers are owned by them, so they end too).
            if conn is not None and conn.started_here:
                stop_local_autoscaler()
                ray.shutdown()
                stop_guard(conn.guard)  # what the shutdown left of the cluster

        self._thread = threading.Thread(target=release, name="ray-release")
        self._thread.start()

    def __enter__(self) -> RayRelease:
        return self

    def wait(self) -> None:
        """Until Ray is down: what Ray's threads still log of the trials it ended (a killed trial's
        traceback, under load seconds late) is then printed before the caller's last line, not after."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self._gc_was_enabled:
                gc.enable()
            self._held = ()

    def __exit__(self, *exc: object) -> None:
        self.wait()


def cmd_run(args: argparse.Namespace) -> int:
    """``dpo-sweep run SPACE.yaml``: see the module doc for the steps and exit codes."""
    with signals.stop_signals_raise(), RayRelease() as release:
        return _run(args, release)


def _run(args: argparse.Namespace, release: RayRelease) -> int:
    sp = space_mod.load(args.space, args.overrides)  # UserError -> exit 2, before anything starts
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UserError(f"--max-concurrent: {args.max_concurrent} is not allowed; give 1 or more")
    timeout = getattr(args, "trial_timeout_s", None)
    if timeout is not None and not timeout >= 0:
        raise UserError(f"--trial-timeout-s: {timeout} is not allowed; give seconds (0: no limit)")
    every = getattr(args, "report_every_s", None)
    if every is not None and not every >= 0:
        raise UserError(f"--report-every-s: {every:g} is not allowed; give seconds (0: no report until the sweep ends)")
    out_dir = Path(args.output) if args.output else default_output_dir(sp.name)
    preflight.check_output_dir(out_dir)  # a file given as the folder: said before the lock makes it
    try:
        with FolderLock(out_dir):  # exit 2 when another sweep writes there (folder_lock.py)
            return _sweep(args, release, sp, out_dir)
    except OSError as err:  # a full disk or a read-only folder, at any step: one line, the rows kept
        print(f"error: {os_error_line(err)}; the rows written before are kept. Once fixed, continue with: "
              f"{_stopping().resume_command(args.space, str(out_dir), args.overrides)}", file=sys.stderr)
        return 1


def _sweep(args: argparse.Namespace, release: RayRelease, sp: space_mod.Space, out_dir: Path) -> int:
    total = len(sp.trials)
    for point in sp.skipped:  # the points no trial runs for, each with its reason (validate lists them too)
        print(point.line())
    # Exit 2 before anything starts when the space changes what the folder's rows measured.
    renamed = match_rows(out_dir, sp, bool(getattr(args, "accept_rows", False))).renamed if args.resume else {}
    # A resumed sweep with every row written starts no Ray (a look only: prepare_output decides).
    nothing_to_run = (bool(args.resume) and renamed_ids(finished_trial_ids(out_dir), renamed)
                      >= {t.trial_id for t in sp.trials})
    planned = [absolute_paths(t) for t in sp.trials]  # as the trials will see them
    train = not warm_worker.wanted(sp.trials[0])  # its trials run in Ray Train workers
    conn: RayConnection | None = None
    pool: warm_worker.WarmPool | None = None
    slots: TrialSlots | None = None
    try:
        # startup.py: the file checks (exit 2, nothing started), then the rest of the preflight
        # (exit 2, before anything is written) in its own process while Ray and the warm workers
        # start, and then Tune is imported.
        files = preflight.check_files(sp.trials, out_dir)
        with BackgroundPreflight(sp.trials, out_dir, planned, files) as pending:
            if not nothing_to_run:
                try:
                    conn = connect_ray(args.address, dashboard=not args.no_dashboard, train=train)
                    signals.take_stop_signals()  # back from Ray's driver
                    slots = trial_slots(sp, ray.cluster_resources(), args.max_concurrent)
                    planned = simulation_decided(planned, ray.cluster_resources(), slots)
                    pool = start_warm_workers(planned, slots)
                except Exception:
                    pending.result()  # a refusal of the input comes first
                    raise
            import_tune()
            checked = pending.result()
        done_ids = _prepare(args, out_dir, checked, sp, renamed)
        if done_ids >= {t.trial_id for t in sp.trials}:
            say(f"resume: all {total} trial(s) are already in {ResultsDir(out_dir).results}; nothing to run")
            return _analyse(out_dir, args, say, sp.spec, checked)
        if conn is None:  # a resume that looked finished but was not (prepare_output decided)
            conn = connect_ray(args.address, dashboard=not args.no_dashboard, train=train)
            signals.take_stop_signals()
        print_dashboard(conn, say)
        # The plan's memory model takes the data's lengths and the models' shapes as the
        # preflight's process measured and built them: this process builds no model.
        if slots is None:
            slots = trial_slots(sp, ray.cluster_resources(), args.max_concurrent)
            planned = simulation_decided(planned, ray.cluster_resources(), slots)
        summary = run_sweep(sp, out_dir, trials=planned, slots=slots, done_ids=done_ids,
                            full_grid=bool(getattr(args, "full_grid", False)),
                            lengths=checked.lengths, shapes=checked.shapes, pool=pool,
                            trial_timeout_floor_s=_timeout_floor(args),
                            on_rows=LiveReport(out_dir, args, sp.spec, checked, _report_every_s(args)))
    except InfrastructureError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # before the trials start, or a second stop signal: rows on disk are kept
        stopping = _stopping()
        say(stopping.interrupted_line(len(finished_trial_ids(out_dir)), total,
                                      stopping.resume_command(args.space, str(out_dir), args.overrides)))
        return signals.exit_code(signals.signum_of(err))
    finally:
        release.start(pool, conn)  # also ends the trials still running when the sweep stopped early
    if summary.stopped is not None:
        return _stopped_early(summary, args, out_dir, total)
    files = ResultsDir(out_dir)
    say(f"sweep finished: {summary.ran} configuration(s) in {summary.ray_trials} Ray trial(s), "
        f"{summary.skipped} skipped; results in {files.results}, worker output in {files.logs}/")
    analysed = _analyse(out_dir, args, say, sp.spec, checked)
    if summary.crashed or summary.timed_out:
        release.wait()  # the last line is ours
        print(lost_line(summary, _stopping().resume_command(args.space, str(out_dir), args.overrides)),
              file=sys.stderr)
        return 1
    return analysed


def lost_line(summary: SweepSummary, resume: str) -> str:
    """The last line of a sweep some of whose trials have no result: how many timed out, how many
    processes died, which, and the command that runs them again."""
    lost = [*summary.timed_out, *summary.crashed]
    causes = [f"{n} {what}" for n, what in ((len(summary.timed_out), "timed out (past --trial-timeout-s or "
                                            "4x the estimate of the trial)"),
                                           (len(summary.crashed), "died (a trial process lost: not OOM or "
                                            "divergence)")) if n]
    return (f"error: the sweep finished without a result for {len(lost)} of its {summary.ran} trial(s): "
            f"{' and '.join(causes)}: {excerpt(', '.join(lost), 200)}; their rows are marked "
            f"infrastructure_failure and --resume runs them again: {resume}")
