"""Test helpers: a real Ray cluster on this machine, and `dpo-sweep run` as a subprocess.

Nodes are started with ``ray start --block`` as child processes of the test: stopping one is
terminating that process (its reaper then ends the node's raylet, GCS and workers), so a test
never touches Ray processes it did not start (``ray stop`` would stop every Ray node on the host).
Token authentication is switched on with a token made for the test (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN``), so the dashboard checks run the same way on every machine and nothing is
written to ``~/.ray``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testkit import free_port

from dpo_sweep.records import read_csv_rows as read_csv  # noqa: F401  (the tests' name)

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
DPO_SWEEP = [sys.executable, "-m", "dpo_sweep"]


def auth_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, PYTHONUNBUFFERED="1")
    return env


@dataclass
class Cluster:
    """Nodes of one local test cluster; ``address`` is the head's GCS address."""

    address: str
    dashboard_url: str
    token: str
    env: dict[str, str]
    log_dir: Path
    temp_dir: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def add_worker(self, num_cpus: float) -> None:
        # The head's address: the node's auto-detected IP (the host's first interface) would
        # differ from machine to machine; every node of this cluster lives on 127.0.0.1.
        self.procs.append(_start_node(
            ["--address", self.address, "--num-cpus", str(num_cpus), "--node-ip-address",
             "127.0.0.1"], self.env,
            self.log_dir / f"worker{len(self.procs)}.log"))

    def alive_nodes(self) -> int:
        out = subprocess.run(
            [sys.executable, "-c", "import ray; ray.init(address=%r, logging_level='error'); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))" % self.address],
            env=self.env, capture_output=True, text=True, timeout=60)
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else -1

    def train_worker_nodes(self) -> set[str]:
        """Node ids of every Ray Train worker actor this cluster has run (dead ones included).
        The state API is given this cluster's dashboard: left to find one, it refuses when another
        Ray instance runs on the machine (the session's shared head, conftest.py)."""
        out = subprocess.run(
            [sys.executable, "-c", "import ray; from ray.util.state import list_actors; "
             "ray.init(address=%r, logging_level='error'); "
             "print(' '.join(sorted({a.node_id for a in list_actors(address=%r, filters=[('class_name', '=', "
             "'RayTrainWorker')], limit=1000)})))" % (self.address, self.dashboard_url)],
            env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return set((out.stdout.strip().splitlines() or [""])[-1].split())  # none yet: an empty line

    def wait_for_nodes(self, n: int, timeout_s: float = 60) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.alive_nodes() == n:
                return
            time.sleep(1)
        raise TimeoutError(f"the cluster did not reach {n} nodes; logs in {self.log_dir}")

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first, then the head
            stop_process(p)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as fh:
        return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], env=env,
                                stdout=fh, stderr=subprocess.STDOUT)


def stop_process(p: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGINT (a graceful Ray shutdown), then SIGTERM, then SIGKILL, to this one process."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue


def start_head(log_dir: Path, num_cpus: float, dashboard: bool = True) -> Cluster:
    token = uuid.uuid4().hex
    env = auth_env(token)
    port, dash_port = free_port(), free_port()
    args = ["--head", "--port", str(port), "--num-cpus", str(num_cpus), "--num-gpus", "0",
            "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dash_port),
            f"--include-dashboard={'true' if dashboard else 'false'}"]
    # A private temp dir: `ray start` records its address in <temp dir>/ray_current_cluster, and in
    # the shared /tmp/ray that record would make every later bare ray.init() on this machine try
    # to join this (soon stopped) cluster. Short path: Ray's unix sockets live under it.
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    args.append(f"--temp-dir={temp_dir}")
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(address=f"127.0.0.1:{port}", dashboard_url=f"http://127.0.0.1:{dash_port}",
                      token=token, env=env, log_dir=log_dir, temp_dir=temp_dir)
    cluster.procs.append(_start_node(args, env, log_dir / "head.log"))
    try:
        cluster.wait_for_nodes(1, timeout_s=90)
    except Exception:
        cluster.stop()
        raise
    return cluster


def http_get(url: str, token: str | None = None, timeout_s: float = 10) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def run_sweep(args: list[str], env: dict[str, str], timeout_s: float = 240,
              **popen) -> subprocess.CompletedProcess:
    """``dpo-sweep run`` to the end; past ``timeout_s`` the failure shows the tail of its output."""
    try:
        return subprocess.run([*DPO_SWEEP, "run", *args], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=timeout_s, **popen)
    except subprocess.TimeoutExpired as err:
        tail = [(s.decode(errors="replace") if isinstance(s, bytes) else s or "")[-4000:]
                for s in (err.stdout, err.stderr)]
        raise AssertionError(f"dpo-sweep run {' '.join(args)} still running after {timeout_s} s\n"
                             f"--- stdout tail ---\n{tail[0]}\n--- stderr tail ---\n{tail[1]}") from None


def start_sweep(args: list[str], env: dict[str, str], log: Path, **popen) -> subprocess.Popen:
    fh = log.open("w")
    return subprocess.Popen([*DPO_SWEEP, "run", *args], env=env, cwd=REPO, stdout=fh,
                            stderr=subprocess.STDOUT, **popen)


def session_pids(sid: int, *prefixes: str) -> set[int]:
    """Live processes of session ``sid`` (a sweep started with ``start_new_session``: its local
    cluster's processes inherit it) whose command line starts with one of ``prefixes`` (Ray's
    process titles: ``ray::TrialWorker``, ``ray::trial <id>``, ``ray::WorkerPool``)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
            stat = (cmdline.parent / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z" and text.startswith(prefixes):
            found.add(int(cmdline.parent.name))
    return found


def write_space(path: Path, name: str, search: str, train_extra: str = "") -> Path:
    """A small CPU space: tiny-llama, 16 synthetic pairs, 3 steps (1 warm-up), fp32."""
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{preset: tiny-llama}}
        data: {{synthetic: {{pairs: 16, prompt_tokens: 24, response_tokens: 23}}}}
        train: {{steps: 3, warmup_steps: 1, lr: 1.0e-3, max_length: 64, precision: fp32, seed: 0{train_extra}}}
        resources: {{workers_per_trial: 1, use_gpu: false, cpus_per_worker: 0.5}}
        search:
        """) + textwrap.indent(textwrap.dedent(search), "  ") + "objectives: {memory: min, throughput: max, loss_std: min}\n")
    return path
