"""The signals that end a sweep as Ctrl-C does: SIGINT, SIGTERM (a ``kill``, a scheduler's
preemption, ``docker stop``) and SIGHUP (the terminal closed). Each keeps the finished rows and
prints the ``--resume`` command; the exit code is the shell's for that signal, 128 + its number
(130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP). No Ray or Tune here: the command installs
them before either is imported."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """A stop signal outside the trials' loop (before they start, or a second one): raised where
    the command is, as Python raises KeyboardInterrupt for SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(signum: int) -> int:
    return 128 + signum


def signum_of(err: KeyboardInterrupt) -> int:
    return getattr(err, "signum", signal.SIGINT)


def _raise(signum: int, frame: object) -> None:
    raise StopSignal(signum)


def take_stop_signals() -> None:
    """Make SIGTERM and SIGHUP raise :class:`StopSignal` in the main thread (SIGINT raises
    KeyboardInterrupt already). Called again after ``ray.init``, whose driver installs a SIGTERM
    handler of its own that ends the process with Ray's crash report."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise)


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, :func:`take_stop_signals`; the handlers before it are restored after."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    take_stop_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
