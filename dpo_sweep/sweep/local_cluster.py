"""The local Ray cluster a sweep starts for itself: reachable from this machine only, and gone soon
after the sweep's driver, however the driver ends.

- **Loopback only.** Ray 2.60's servers (GCS, raylet, workers, the dashboard agent, the runtime-env
  agent) listen on 127.0.0.1 only when the node's IP is 127.0.0.1, and ``ray.init`` turns a
  ``_node_ip_address`` of 127.0.0.1 into the machine's first interface unless
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is off (what Ray does on macOS and Windows, where it keeps a
  local cluster local). :func:`loopback_only` switches it off while ``ray.init`` starts the
  cluster; the processes it starts inherit the setting, and a ``--address`` cluster is untouched.
- **Gone with the driver.** After a ``kill -9`` of the driver, Ray's reaper ends the driver's
  process group, but the dashboard agent and the runtime-env agent live in their own and, finding
  their raylet gone, spend up to 60 s trying to report it to the GCS that is gone too.
  :func:`start_guard` hands the cluster's processes (every descendant of this process once
  ``ray.init`` returned) to a small watcher in a session of its own: it waits for the end of a
  pipe from this process and then SIGKILLs those of them still alive (a pid is checked against its
  start time, so a reused one is never hit).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Iterator

import psutil

_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"

#: The watcher (run with ``python -c``): argv[1] is a JSON list of [pid, create_time].
_WATCHER = """\
import json, sys
import psutil
sys.stdin.read()  # returns at EOF: the sweep's driver closed the pipe or died
for pid, created in json.loads(sys.argv[1]):
    try:
        proc = psutil.Process(pid)
        if proc.create_time() == created:
            proc.kill()
    except psutil.Error:
        pass
"""


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While ``ray.init`` starts a local cluster: its node IP is 127.0.0.1 (see the module doc)."""
    from ray._private import ray_constants

    before_env, before = os.environ.get(_CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_SWITCH] = "0"  # the cluster's processes: they read it when they import Ray
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray already
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if before_env is None:
            os.environ.pop(_CLUSTER_SWITCH, None)
        else:
            os.environ[_CLUSTER_SWITCH] = before_env


def start_guard() -> subprocess.Popen:
    """The watcher of this process's descendants now (the local cluster just started); closing
    its stdin (:func:`stop_guard`), or this process's death, sets it off."""
    procs = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            procs.append([child.pid, child.create_time()])
    return subprocess.Popen([sys.executable, "-c", _WATCHER, json.dumps(procs)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # out of the process group Ray's reaper ends


def stop_guard(guard: subprocess.Popen | None) -> None:
    """After ``ray.shutdown()``: the watcher ends what is left of the cluster, and itself."""
    if guard is None:
        return
    with contextlib.suppress(OSError):
        guard.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=10)
