"""The Ray connection of a sweep: join a cluster or start a local one, with the Ray Train settings
for short trials, and tell the user where the dashboard is and how token authentication logs in."""
from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray

from dpo_sweep.sweep.console import say
from dpo_sweep.sweep.local_cluster import LOOPBACK, loopback_only, start_guard


class InfrastructureError(RuntimeError):
    """Ray or Tune failed (not a trial's result): ``dpo-sweep run`` exits 1."""


@dataclass(frozen=True)
class RayConnection:
    dashboard_url: str | None
    token_auth: bool
    started_here: bool  # ray.init() was called by this run (so this run shuts it down)
    #: The watcher that ends a local cluster's processes with this one (local_cluster.py).
    guard: subprocess.Popen | None = field(default=None, compare=False)


def _token_auth_enabled() -> bool:
    try:  # private module; token auth exists from Ray 2.52 and is on by default for local clusters from 2.59
        from ray._private.authentication.authentication_utils import is_token_auth_enabled

        return bool(is_token_auth_enabled())
    except Exception:  # noqa: BLE001 - older Ray: no token auth
        return False


#: Ray Train settings for short trials (a user's own environment variables win); what a trial's
#: start-up and teardown cost is measured by benchmarks/sweep_overhead.py, results in
#: benchmarks/results/sweep_overhead/cpu-reused-trial-processes/README.md.
#: - the controller polls the worker group every 2 s by default: a finished trial waited for it;
#: - the preemption watcher (for spot instances) polls every 5 s and held ``fit()`` back as long.
#: - Train's print patch echoed every line of the trainer's progress twice on the console.
RAY_TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # The dashboard's Train page (Train V2: /api/train/v2/runs/v1): each trial's Train run by its trial id;
    # without it the page answers 500 ("Train state data is not available").
    "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",
}


def _ray_env() -> dict[str, str]:
    """RAY_TRAIN_ENV, less what the user set; also exported here, so a local cluster started by
    this process inherits it, and passed as the job's runtime_env for an existing cluster."""
    env = {k: v for k, v in RAY_TRAIN_ENV.items() if k not in os.environ}
    os.environ.update(env)
    return env


#: Run by Ray in every new worker process of the sweep's job (worker_setup.py).
SETUP_HOOK = "dpo_sweep.sweep.worker_setup.quiet_ray_train_logs"


def job_runtime_env(joined: bool, train: bool) -> dict[str, object] | None:
    """The sweep job's ``runtime_env``: only what its workers would not have otherwise. A local
    cluster started here inherits this process's environment (:func:`_ray_env` exports
    RAY_TRAIN_ENV), so its env_vars go only to a cluster joined with ``--address``; the setup hook
    only where Ray Train runs (``train``: trials not in warm workers), whose log it quiets. Any
    runtime_env makes every new worker process wait for Ray's runtime-env agent (most of a second
    each: benchmarks/README.md#start-up-and-shutdown), and the warm workers and each Tune trial
    process are such processes."""
    env: dict[str, object] = {}
    variables = _ray_env()
    if joined and variables:
        env["env_vars"] = variables
    if train:
        env["worker_process_setup_hook"] = SETUP_HOOK
    return env or None


#: Seconds the address check waits for a connection and for the GCS's answer: ``ray.init`` itself
#: retries for 20 s against a cluster that refuses its token and for minutes against a port that
#: accepts and never answers.
CONNECT_TIMEOUT_S = 5.0


def _token() -> tuple[str | None, str]:
    """The token Ray's driver would send, and where it comes from (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None, str(path)
    except OSError:
        return None, str(path)


def _gcs_answer(address: str, token: str | None) -> Any:
    """The gRPC status code of the GCS's GetClusterId at ``address`` (OK when it answered)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=CONNECT_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK


def check_address(address: str) -> None:
    """Within seconds, InfrastructureError naming why ``address`` (``host:port`` of a Ray
    cluster's GCS) cannot be joined: nothing listens there, it is not Ray, or its token
    authentication refuses this process (and the fix). Other forms (``ray://``, ``auto``) are
    left to ``ray.init``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        raise InfrastructureError(f"nothing listens at {address}: is the Ray head running there "
                                  "(`ray start --head` prints its address), and is the port right (6379 by default)?") from None
    except (socket.timeout, TimeoutError):
        raise InfrastructureError(f"no connection to {address} within {CONNECT_TIMEOUT_S:g} s: the host is "
                                  "unreachable from here, or a firewall drops the port") from None
    except OSError as err:
        raise InfrastructureError(f"cannot reach {address}: {err.strerror or err}") from None
    import grpc

    code = _gcs_answer(address, None)
    if code == grpc.StatusCode.OK:
        return
    if code != grpc.StatusCode.UNAUTHENTICATED:
        raise InfrastructureError(
            f"{address} does not answer as a Ray cluster ({code.name}): give the head's GCS address as "
            "`ray start --head` prints it (port 6379 by default; the dashboard's 8265 is not it)")
    token, source = _token()
    sent = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    how = ("export RAY_AUTH_MODE=token and the cluster's token: RAY_AUTH_TOKEN=<token>, or the file "
           f"~/.ray/auth_token (print it on the head with `{auth_token_command()}`)")
    if not sent:
        raise InfrastructureError(f"the Ray cluster at {address} uses token authentication and this process "
                                  f"sends no token (RAY_AUTH_MODE is not token): {how}")
    if token is None:
        raise InfrastructureError(f"the Ray cluster at {address} uses token authentication; RAY_AUTH_MODE=token "
                                  f"is set but no token was found ({source}): {how}")
    if _gcs_answer(address, token) == grpc.StatusCode.UNAUTHENTICATED:
        raise InfrastructureError(f"the Ray cluster at {address} refuses the token this process sends (from "
                                  f"{source}): it is not that cluster's; {how}")


def connect_ray(address: str | None, dashboard: bool, train: bool = True) -> RayConnection:
    """Join ``address`` (or ``RAY_ADDRESS``) or start a new local cluster; reuse this process's
    connection when it already has one (a notebook, or a caller that ran ``ray.init``).
    ``train``: the sweep's trials run in Ray Train workers (:func:`job_runtime_env`)."""
    if ray.is_initialized():
        url = ray._private.worker.get_dashboard_url() if dashboard else None  # noqa: SLF001
        return RayConnection(_with_scheme(url), _token_auth_enabled(), started_here=False)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_address(address)
    guard = None
    try:
        runtime_env = job_runtime_env(joined=bool(address), train=train)
        quiet = quiet_driver_settings()
        # Its "Token authentication is enabled" warning says less than print_dashboard's note.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        if address:
            ctx = ray.init(address=address, runtime_env=runtime_env, **quiet)
        else:
            # "local": always a new cluster. A bare ray.init() would join whatever cluster
            # `ray start` last recorded in /tmp/ray (and hang if that one is gone).
            # Reachable from this machine only, and gone soon after this process (local_cluster.py).
            with loopback_only():
                ctx = ray.init(address="local", include_dashboard=dashboard, runtime_env=runtime_env,
                               _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK, **quiet)
            guard = start_guard()
    except Exception as err:  # noqa: BLE001
        where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
        raise InfrastructureError(f"could not connect to {where}: {err}") from err
    url = getattr(ctx, "dashboard_url", None) if dashboard or address else None
    return RayConnection(_with_scheme(url), _token_auth_enabled(), started_here=True, guard=guard)


def stop_local_autoscaler() -> None:
    """End the autoscaler's monitor of the local cluster this process started, at once (SIGKILL),
    before ``ray.shutdown()``. The shutdown sends it SIGTERM, which it answers by reporting a failure
    to a GCS that is going down, and then waits the 1 s Ray allows before killing it anyway: most
    of ray.shutdown's time (benchmarks/README.md#start-up-and-shutdown). A local cluster has nothing to
    autoscale. Ray's private state (``_global_node``, 2.60): where it differs, nothing is done and
    Ray's own shutdown ends the monitor."""
    try:
        from ray._private import ray_constants

        node = ray._private.worker._global_node  # noqa: SLF001
        monitors = node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []) if node is not None else []
    except Exception:  # noqa: BLE001 - see the doc
        return
    for info in monitors:
        try:
            info.process.kill()
            info.process.wait(timeout=1)
        except Exception:  # noqa: BLE001 - already gone, or not ours to wait for
            pass


def quiet_driver_settings() -> dict[str, object]:
    """``ray.init`` settings for the sweep's console. ``log_to_driver=False``: what Ray's worker
    processes print (the trial processes, the Train controllers - which logged an OOM's traceback
    twice -, placement-group cleaners, and the training workers before their output goes to
    DIR/logs/) stays in Ray's session logs instead of being echoed here; a trial's failure still
    reaches its row and progress line through its result. The "ray" logger of this process at
    WARNING: not Ray's "Started a local Ray instance" and Tune's result-file notes."""
    return {"log_to_driver": False, "logging_level": logging.WARNING}


def auth_token_command() -> str:
    """The command that prints the cluster's token from this interpreter: the ``ray`` script next
    to it (a virtualenv's, whether or not it is activated), else the CLI module."""
    script = Path(sys.executable).with_name("ray")
    if script.is_file() and os.access(script, os.X_OK):
        return f"{shlex.quote(str(script))} get-auth-token"
    return f"{shlex.quote(sys.executable)} -m ray.scripts.scripts get-auth-token"


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
        out(f"  token authentication is on: the dashboard asks for the cluster's token. Print it with "
            f"`{auth_token_command()}` (stored in ~/.ray/auth_token unless RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH is set); REST clients send `Authorization: Bearer <token>`.")
