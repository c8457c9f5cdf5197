"""`dpo-sweep run --address` against what a user may give it, for real: a port where nothing
listens, a server that is not Ray, and a Ray head with token authentication joined without the
token or with a wrong one. Each ends in seconds (not the minutes ray.init waits) with exit 1 and
the cause named, and the fix where there is one."""
from __future__ import annotations

import http.server
import threading
import time

import pytest
from sweep_cluster import auth_env, run_sweep, write_space
from testkit import free_port

pytestmark = pytest.mark.slow


def _run(tmp_path, address: str, env: dict[str, str]) -> tuple[int, str, float]:
    space = write_space(tmp_path / "a.yaml", "address", "micro_batch: [2]\n")
    start = time.monotonic()
    proc = run_sweep([str(space), "--output", str(tmp_path / "out"), "--address", address, "--no-dashboard"],
                     env, timeout_s=120)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def test_nothing_listening_is_said_in_seconds(tmp_path):
    rc, text, seconds = _run(tmp_path, f"127.0.0.1:{free_port()}", auth_env("x"))
    assert rc == 1 and "nothing listens at 127.0.0.1:" in text and "Traceback" not in text, text[-3000:]
    assert seconds < 45, seconds


def test_a_server_that_is_not_ray_is_said_in_seconds(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc, text, seconds = _run(tmp_path, f"127.0.0.1:{server.server_address[1]}", auth_env("x"))
    finally:
        server.shutdown()
    assert rc == 1 and "does not answer as a Ray cluster" in text and "Traceback" not in text, text[-3000:]
    assert seconds < 45, seconds


def test_token_authentication_is_named_with_the_fix(tmp_path, ray_head):
    """On the test run's shared head (``ray_head``): without the token, then with a wrong one."""
    cluster = ray_head
    no_mode = {k: v for k, v in cluster.env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    rc, text, seconds = _run(tmp_path, cluster.address, {**no_mode, "HOME": str(tmp_path)})
    assert rc == 1 and "uses token authentication and this process sends no token" in text, text[-3000:]
    assert "export RAY_AUTH_MODE=token" in text and seconds < 45, seconds
    rc, text, seconds = _run(tmp_path, cluster.address, {**cluster.env, "RAY_AUTH_TOKEN": "not-the-token"})
    assert rc == 1 and "refuses the token this process sends (from RAY_AUTH_TOKEN)" in text, text[-3000:]
    assert seconds < 45, seconds
