"""Command line: ``dpo-sweep run | validate | report | recommend | compare | trial``: the arguments
parsed, then the command's body called (:mod:`dpo_sweep.commands`, one module each), and its
exceptions turned into exit codes.

Exit codes: 0 done (OOM or diverged trials are results), 1 infrastructure failure (a ``run``
whose trials timed out or were lost, or whose final analysis failed, included; or ``run``'s
first trials all failing the same way before a step), 2 invalid input (the message names the
field, the value and what is allowed), 130 Ctrl-C.
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading

from dpo_sweep.errors import UserError, os_error_line
from dpo_sweep.results_dir import ResultsDir


def _safety_margin_flag(parser: argparse.ArgumentParser) -> None:
    # None = analysis.recommend.DEFAULT_SAFETY_MARGIN (not imported here: it pulls in pandas).
    parser.add_argument("--safety-margin", type=float, default=None,
                        help="fraction of the budget kept free (default 0.05)")


def _simulate_ranks_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--simulate-ranks", choices=("auto", "true", "false"), default=None,
                        help="resources.simulate_ranks: run a trial of N workers as rank 0 alone on one device "
                        "through the fake process group (true), as N real workers (false), or simulated only "
                        "where the cluster has fewer GPUs than the trial's workers (auto, the default)")


def _simulate_override(args: argparse.Namespace) -> None:
    """``--simulate-ranks X`` as the override ``resources.simulate_ranks=X`` (after any --set)."""
    if getattr(args, "simulate_ranks", None) is not None:
        args.overrides = [*args.overrides, f"resources.simulate_ranks={args.simulate_ranks}"]


def _budget_gb(text: str) -> float:
    """``--memory-budget-gb``: GB, or a card of the catalog (dpo_sweep/cards.py) for its memory."""
    from dpo_sweep import cards

    try:
        return cards.budget_gb(text)
    except cards.UnknownCard as err:  # argparse: exit 2 with this message
        raise argparse.ArgumentTypeError(str(err)) from None


def _cards(text: str):
    from dpo_sweep import cards

    try:
        return cards.cards(text)
    except cards.UnknownCard as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_BUDGET_HELP = "GB (1e9 bytes) per GPU, or a card name for its memory (e.g. H100, A100-40GB, L4)"


def _epochs(text: str) -> float:
    """``--epochs``: a positive, finite number of passes over the data."""
    try:
        epochs = float(text)
    except ValueError:
        epochs = float("nan")
    if not 0 < epochs < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of passes over the data, e.g. 1 or 3")
    return epochs


def _forecast_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=_epochs, default=None,
                        help=f"passes over the data for the run forecast in {ResultsDir.RECOMMENDATION} (default 1)")
    parser.add_argument("--gpu", type=_cards, metavar="NAME[,NAME...]",
                        help="also estimate the run on these cards (scaled from the measured card; labelled "
                        "estimates, never measurements)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpo-sweep",
        description="Sweep DPO training settings (micro-batch, checkpoint level, grad-acc, beta) "
        "and find the memory / time / stability frontier.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a sweep with Ray Tune")
    r.add_argument("space", help="search-space YAML file")
    r.add_argument("--output", help="results directory (default: reports/<space name>/)")
    r.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS or a new local one)")
    r.add_argument("--resume", action="store_true", help="continue a sweep, skipping finished trials")
    r.add_argument("--accept-rows", action="store_true",
                   help=f"with --resume: keep the folder's rows although its {ResultsDir.SPACE} is missing or does not "
                   "name them (your word that they measured this space's settings)")
    r.add_argument("--max-concurrent", type=int, help="trials running at once (default: from GPUs)")
    r.add_argument("--no-dashboard", action="store_true", help="start Ray without its dashboard")
    r.add_argument("--memory-budget-gb", type=_budget_gb, help=f"budget for the recommendation: {_BUDGET_HELP}")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change the space file's settings, as validate and trial take them, e.g. "
                   f"--set train.steps=8 --set micro_batch=2, or micro_batch=[2,4] to sweep those (repeatable; "
                   f"DIR/{ResultsDir.SPACE} records the result)")
    r.add_argument("--trial-timeout-s", type=float, default=None, metavar="S",
                   help="end a trial as status timeout past max(S, 4x the sweep's estimate of it); "
                   "--resume runs it again (default 900; 0: no limit)")
    r.add_argument("--report-every-s", type=float, default=None, metavar="S",
                   help=f"while the sweep runs, rewrite DIR/{ResultsDir.REPORT} (and the other analysis files) from the "
                   "rows so far at most every S seconds, so a browser tab can be refreshed (default 60; 0: only "
                   "at the end)")
    r.add_argument("--full-grid", action="store_true",
                   help="run every configuration in full: no pruning, shared measurements or short accumulation")
    _simulate_ranks_flag(r)
    _safety_margin_flag(r)
    _forecast_flags(r)

    v = sub.add_parser("validate", help="check a space file and print its trials; runs nothing")
    v.add_argument("space")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    v.add_argument("--gpu", type=_cards, metavar="NAME[,NAME...]",
                   help="a fit table per card: which configurations fit its memory, with how much to spare, "
                   "and the cheapest lever that makes one fit (cards: T4, L4, A10, RTX4090, A6000, L40S, "
                   "A100-40GB, A100-80GB, H100, H200, B200)")
    _safety_margin_flag(v)

    rep = sub.add_parser("report", help="re-analyse a results dir; rewrite frontier/recommendation/report")
    rep.add_argument("dir")
    rep.add_argument("--memory-budget-gb", type=_budget_gb,
                     help=(f"budget for the recommendation: {_BUDGET_HELP} (default: the card size of "
                           f"{ResultsDir.SPACE} or {ResultsDir.ENVIRONMENT})"))
    _safety_margin_flag(rep)
    _forecast_flags(rep)

    rec = sub.add_parser("recommend", help="print the recommended configuration for a memory budget")
    rec.add_argument("dir")
    rec.add_argument("--memory-budget-gb", type=_budget_gb, required=True, help=_BUDGET_HELP)
    rec.add_argument("--write", action="store_true",
                     help=f"write DIR/{ResultsDir.RECOMMENDED} for this budget (replacing the report's)")
    _safety_margin_flag(rec)

    cmp = sub.add_parser("compare", help="two sweeps side by side: the same configurations' memory and "
                         "tokens/s, and what changed between the runs")
    cmp.add_argument("first", metavar="DIR1")
    cmp.add_argument("second", metavar="DIR2")

    t = sub.add_parser("trial", help="run one configuration in this process, without Ray")
    t.add_argument("space")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="pick a value, e.g. --set micro_batch=4 --set checkpoint_level=L2 "
                   "--set train.steps=3 (repeatable)")
    t.add_argument("--output", help="results directory (default: reports/<space name>-trial/; beside a space "
                   "file that lies in a sweep's results folder: <that folder>/<space name>-trial/)")
    _simulate_ranks_flag(t)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _simulate_override(args)
    try:
        if args.command == "validate":
            from dpo_sweep.commands.validate import cmd_validate

            return cmd_validate(args)
        if args.command == "trial":
            from dpo_sweep.commands.trial import cmd_trial

            return cmd_trial(args)
        if args.command == "run":
            from dpo_sweep.sweep.signals import stop_signals_raise

            with stop_signals_raise():  # SIGTERM / SIGHUP as Ctrl-C from here on, imports included
                from dpo_sweep.commands.run import cmd_run

                return cmd_run(args)
        if args.command == "compare":
            from dpo_sweep.commands.compare import cmd_compare

            return cmd_compare(args)
        if args.command in ("report", "recommend"):
            from dpo_sweep.commands import report

            return report.cmd_report(args) if args.command == "report" else report.cmd_recommend(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a read-only folder: said in one line, files replaced whole or not at all
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP during `run` (sweep/signals.py)
        print("interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", 2)
    return 1


def entry() -> None:
    """The ``dpo-sweep`` command and ``python -m dpo_sweep``: :func:`main`, then the process ends
    without the interpreter's teardown of every module it loaded. After a sweep (torch,
    transformers, Ray, pandas, plotly) that teardown takes over a second, after the report is
    written and nothing is left to do. What an exit does that matters still happens:
    threads that are not daemons are waited for, the atexit handlers run (logging's flush, Ray's
    shutdown when it is still up), the output is flushed. Tests call :func:`main` itself."""
    rc = main()
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(rc if isinstance(rc, int) else 1)


if __name__ == "__main__":
    entry()
