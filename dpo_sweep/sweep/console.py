"""The sweep's console output (kept free of Ray and Tune: the command prints before they are imported)."""
from __future__ import annotations


def say(line: str) -> None:
    """Progress output of the sweep (flushed: the sweep's output is often piped to a log)."""
    print(line, flush=True)
