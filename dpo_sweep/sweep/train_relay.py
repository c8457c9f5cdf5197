"""A Ray Train trial's reports, carried from its Train controller to its Tune trial without a task
that fails.

Ray's ``TuneReportCallback`` carries them through a ``ray.util.queue.Queue``, which the Tune trial's
session polls every 0.2 s with a timed ``get``: each poll that finds nothing ends as a FAILED
``_QueueActor.get`` task (46, then 72 of them in the dashboard of a healthy 2-trial sweep). Here the
controller's :class:`RelayCallback` hands each report to a :class:`ReportRelay` actor named after
the trial, and the Tune trial (:func:`fit_and_forward`: ``fit()`` in a thread) takes them with
``take``, whose empty answer is an answer, not an error, and forwards them with ``tune.report``
in the same order.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import ray

#: How long one ``take`` waits for a report before it answers with none.
TAKE_WAIT_S = 0.5


class ReportRelay:
    """The reports of one trial, in the order they came (an async Ray actor)."""

    def __init__(self) -> None:
        self._items: asyncio.Queue = asyncio.Queue()

    async def put(self, item: dict[str, Any]) -> None:
        self._items.put_nowait(item)

    async def take(self, wait_s: float) -> list[dict[str, Any]]:
        """Every report waiting; when there is none, waits up to ``wait_s`` for one ([] if none comes)."""
        if self._items.empty() and wait_s > 0:
            try:
                self._items.put_nowait(await asyncio.wait_for(self._items.get(), wait_s))
            except asyncio.TimeoutError:
                return []
        items = []
        while not self._items.empty():
            items.append(self._items.get_nowait())
        return items


def relay_callback(relay: Any) -> Any:
    """A Ray Train ``UserCallback`` that hands each report (rank 0's metrics, as
    ``TuneReportCallback`` does) to ``relay``, waiting until it holds it: when ``fit()`` returns,
    every report is there."""
    from ray.train.v2.api.callback import UserCallback

    class RelayCallback(UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            ray.get(relay.put.remote(dict(metrics[0])))

    return RelayCallback()


def fit_and_forward(fit: Callable[[Any], None], name: str, report: Callable[[dict[str, Any]], None]) -> None:
    """Run ``fit(callback)`` (the trainer's ``fit()`` with ``callback`` among its run config's
    callbacks) in a thread while this one forwards its reports to ``report``; re-raises what
    ``fit`` raised. ``name``: the relay actor's, which the dashboard lists (the trial's id)."""
    relay = ray.remote(ReportRelay).options(name=name, num_cpus=0).remote()
    ended = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fit(relay_callback(relay))
        except BaseException as exc:  # noqa: BLE001 - raised again in the trial's thread below
            failure.append(exc)
        finally:
            ended.set()

    thread = threading.Thread(target=run, name=f"fit-{name}", daemon=True)
    thread.start()
    try:
        while True:
            last = ended.is_set()  # read before the take: a report put before the end is taken
            for item in ray.get(relay.take.remote(0.0 if last else TAKE_WAIT_S)):
                report(item)
            if last:
                break
        thread.join()
    finally:
        ray.kill(relay, no_restart=True)
    if failure:
        raise failure[0]
