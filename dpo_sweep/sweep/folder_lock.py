"""One writer at a time in a results directory: ``dpo-sweep run`` holds an exclusive ``flock`` on
``DIR/.sweep.lock`` from before its preflight until its report is written, and ``dpo-sweep trial``
holds it on its ``--output`` from before its checks until its rows are written.

Two sweeps appending to one results.csv double every configuration, and a trial writing into a
running sweep's folder replaces its rows, so a second writer refuses the folder (exit 2) and names
the holder: its pid, host, command and start, written into the lock file
by the holder. The kernel drops a ``flock`` when its process ends, however it ends: a lock file
left behind by a killed sweep (``kill -9``) locks nothing, and ``--resume`` takes it again. The
file's descriptor is not inherited by the processes the sweep starts (Python opens files
close-on-exec), so Ray's processes do not keep a dead sweep's lock.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from dpo_sweep.errors import UserError
from dpo_sweep.results_dir import ResultsDir


def holder_text(path: Path) -> str:
    """Who holds the lock, from what the holder wrote into it."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not written its details yet)"
    return (f"pid {info.get('pid')} on host {info.get('host', '?')}, started {info.get('started', '?')}: "
            f"`{info.get('command', '?')}`")


class FolderLock:
    """``with FolderLock(out_dir):`` holds the directory for this process (see the module doc);
    raises UserError when another process holds it. Leaving the block removes the lock file, and
    the folders that entering created when they are still empty: a refused sweep leaves nothing."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = ResultsDir(out_dir).lock
        self._fh: IO[str] | None = None
        self._created: list[Path] = []

    def __enter__(self) -> FolderLock:
        self._created = [p for p in (self.out_dir, *self.out_dir.parents) if not p.exists()]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        while self._fh is None:
            # "a": opening must not empty a file whose holder's details a refusal reads.
            fh = self.path.open("a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                self._remove_created()
                raise UserError(
                    f"--output {self.out_dir} is in use by another sweep or trial: {holder_text(self.path)}. "
                    "Two writers in one folder would mix or replace its rows; wait for that one to end "
                    "(or stop it), or give another --output") from None
            if self._is_the_file(fh):
                self._fh = fh
            else:  # its holder removed it between our open and our lock: lock the new one
                fh.close()
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                   "command": shlex.join(["dpo-sweep", *sys.argv[1:]]),
                                   "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
        self._fh.flush()
        return self

    def _is_the_file(self, fh: IO[str]) -> bool:
        try:
            return os.path.samestat(os.fstat(fh.fileno()), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _remove_created(self) -> None:
        for folder in self._created:  # the deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty: something else lives there now
                return

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fh is None:
            return
        # Removed while held: a process waiting on this file finds it gone and opens a new one.
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None
        self._remove_created()
