"""``dpo-sweep run``'s start-up: the slowest part - Ray up, then each warm worker's imports in its
own process (torch, transformers, the model's classes, CUDA: seconds) - starts first.

1. The checks that only read files (:func:`dpo_sweep.preflight.check_files`: milliseconds, no
   tokenizer): a missing data file, a bad row or an unwritable output folder is refused (exit 2)
   before anything starts.
2. The rest of the preflight (:func:`check_inputs`: the tokenizers, the data tokenised as the
   workers will, the planner's memory model, this machine's environment.json) in a process of its
   own (:class:`BackgroundPreflight`), started first, while the command's main thread starts Ray
   and the warm workers and then imports Tune. A refusal there (exit 2) shuts down the Ray
   started for it.

The preflight's process is the only one on the driver's side that imports torch and
transformers; the driver takes the model shapes and the environment it found, and never does.
In its own process the preflight's imports do not share the GIL with ``ray.init``: Ray is up
seconds sooner than with the preflight as a thread of the driver. Its niceness is raised
(:data:`PREFLIGHT_NICENESS`): where cores are few, Ray's start and the warm workers' imports,
which the first trial waits for, go first (benchmarks/README.md#start-up-and-shutdown).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from dpo_sweep import preflight
from dpo_sweep.config import ModelSpec, TrialConfig, distinct_models
from dpo_sweep.errors import UserError
from dpo_sweep.plan.shape import ModelShape, model_shape, shape_key
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep import trl_fields

#: Added to the preflight process's niceness (see the module doc).
PREFLIGHT_NICENESS = 10


@dataclass(frozen=True)
class CheckedInputs:
    """What the preflight gave: the data summaries (printed, data.json), each trial's lengths (the
    plan's memory model) by trial id, each model's shape for the memory model (passed to the
    plan: ``SweepPlan(shapes=...)``), this machine's environment.json, and notes on
    this machine for the console (:func:`dpo_sweep.telemetry.bytecode.bytecode_note`)."""

    data: tuple[preflight.DataSummary, ...]
    lengths: dict[str, LengthProfile | None]
    shapes: dict[ModelSpec, ModelShape]
    environment: dict[str, Any] | None
    notes: tuple[str, ...] = ()
    trl: trl_fields.TrlFields | None = None
    """The TRL fields the winner is exported to (read here: importing TRL takes seconds, which the
    driver's analysis would otherwise spend after the sweep)."""


def model_shapes(trials: Sequence[TrialConfig]) -> dict[ModelSpec, ModelShape]:
    """Each model's shape for the planner's memory model (``plan.shape.model_shape``: the meta
    build imports transformers' modelling code, about half of the preflight's time). A
    model whose shape cannot be built is left out: the planner meets it again where that is
    handled."""
    shapes = {}
    for spec in distinct_models(trials):
        try:
            shapes[shape_key(spec)] = model_shape(spec)
        except Exception:  # noqa: BLE001 - see the doc
            continue
    return shapes


def check_inputs(trials: Sequence[TrialConfig], out_dir: Path, planned: Sequence[TrialConfig] = (),
                 files: preflight.CheckedFiles | None = None) -> CheckedInputs:
    """The preflight of ``trials`` (:func:`dpo_sweep.preflight.check_inputs`, after the file checks
    that gave ``files``; a :class:`~dpo_sweep.errors.UserError` on bad input), then, when it
    passed, the memory model's shapes of ``planned`` (the configs as the plan will see them), the
    environment, and - with the imports a worker makes done here too - whether they had bytecode."""
    from dpo_sweep.telemetry import bytecode, environment_info

    data = preflight.check_inputs(tuple(trials), out_dir, files)
    lengths = preflight.lengths_by_trial(trials, data)
    shapes = model_shapes(planned)
    notes = tuple(filter(None, [bytecode.bytecode_note(bytecode.uncached_imports())]))
    return CheckedInputs(data, lengths, shapes, environment_info(), notes, trl_fields.load())


def _preflight_process(conn: Any, args: tuple) -> None:
    """The preflight's process: :func:`check_inputs`, its answer sent back as ``(kind, value)``:
    ``ok`` and the result, ``refused`` and the UserError, or ``failed`` and a traceback's text."""
    from dpo_sweep.sweep.worker_setup import unused_packages_hidden

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle: it ends this
    try:
        os.nice(PREFLIGHT_NICENESS)
    except OSError:
        pass
    try:
        with unused_packages_hidden():
            answer: tuple[str, Any] = ("ok", check_inputs(*args))
    except UserError as err:
        answer = ("refused", err)
    except BaseException:  # noqa: BLE001 - the command raises it, as it would its own
        answer = ("failed", traceback.format_exc())
    conn.send(answer)
    conn.close()
    # Without Python's teardown of torch and transformers (over a second), which the command
    # would wait for: the answer is sent and nothing of this process is left to flush but its output.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class BackgroundPreflight:
    """:func:`check_inputs` in a process of its own (spawned: the command's process has threads)
    from the ``with`` block's start; :meth:`result` waits for its answer and raises its
    UserError in the caller (a process that died without one: InfrastructureError, exit 1).
    Leaving the block ends the process if it still runs (Ray failed, or Ctrl-C): the preflight
    never outlives the command's decision on it.

    ``in_process``: run it in a thread of this process instead (tests whose stand-ins patch
    this process's preflight)."""

    in_process = False

    def __init__(self, trials: Sequence[TrialConfig], out_dir: Path, planned: Sequence[TrialConfig] = (),
                 files: preflight.CheckedFiles | None = None):
        self._args = (tuple(trials), out_dir, tuple(planned), files)
        self._answer: tuple[str, Any] | None = None

    def __enter__(self) -> BackgroundPreflight:
        if self.in_process:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight")
            self._future = self._executor.submit(check_inputs, *self._args)
            return self
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_preflight_process, args=(child_end, self._args),
                                    name="dpo-sweep-preflight")
        self._process.start()
        child_end.close()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.in_process:
            self._executor.shutdown(wait=True)
            return
        if self._process.is_alive() and self._answer is None:
            self._process.terminate()
        self._process.join()
        self._conn.close()

    def result(self) -> CheckedInputs:
        if self.in_process:
            return self._future.result()
        if self._answer is None:
            try:
                self._answer = self._conn.recv()
            except EOFError:
                from dpo_sweep.sweep.ray_cluster import InfrastructureError  # Ray: not in that process

                self._process.join()
                raise InfrastructureError(f"the preflight's process ended without an answer (exit code "
                                          f"{self._process.exitcode})") from None
        kind, value = self._answer
        if kind == "ok":
            return value
        if kind == "refused":
            raise value
        raise RuntimeError(f"the preflight failed:\n{value}")
