"""Shared pieces of the benchmark scripts.

For every script: the checkout on ``sys.path`` (a script runs from a checkout, no install needed:
``sys.path.insert(0, <benchmarks/>)`` then ``from h200_common import ...``), where its results go
(:func:`results_dir`), the device it measures on (:func:`bench_device`) and the GPU's name
(:func:`gpu_name`). For the H200 trainer benchmarks (``trainer_h200.py`` and
``trl_dpo_h200.py``): the named configurations (in priority order), TRL's reference figures from the issue, the
sequence/step scales (``h200`` for the GPU, ``tiny`` to test the plumbing on a CPU), a wall-clock
budget, a subprocess runner with a hard timeout, and the CSV row format both scripts write so that
their files can be joined on ``config``.

Units: our results are GB (1e9 bytes, the results.csv contract); TRL's reference table is GiB
(2^30 bytes). Every ratio below converts first.
"""
from __future__ import annotations

import csv
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout, no install needed
    sys.path.insert(0, str(REPO_ROOT))

from dpo_sweep.nvml_session import nvml_session  # noqa: E402  (no torch import)
from dpo_sweep.records import RESULTS_COLUMNS  # noqa: E402  (no torch import)
from dpo_sweep.records import read_csv_rows as read_rows  # noqa: E402,F401  (re-exported)

GIB = 2**30
GB = 1e9
RESULTS_ROOT = REPO_ROOT / "benchmarks" / "results"


def results_dir(benchmark: str, label: str = "new") -> Path:
    """Where a run of ``benchmark`` writes by default: ``benchmarks/results/<benchmark>/<label>/``.
    Committed runs keep a label that says what they measured and a README.md of provenance (the
    command, the machine, when); ``new`` is the folder to rename before committing."""
    return RESULTS_ROOT / benchmark / label


def bench_device() -> "torch.device":
    """The device a benchmark measures on: the first CUDA GPU, else the CPU (a plumbing run)."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def to_gib(gb: float) -> float:
    """GB (1e9 bytes, our results) -> GiB (2^30 bytes, TRL's table); NaN when not finite."""
    return gb * GB / GIB if math.isfinite(gb) else math.nan
DEFAULT_RESULTS_DIR = results_dir("trainer_h200")


# --- configurations --------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchConfig:
    """One named configuration of the benchmark."""

    name: str
    preset: str               # dpo_sweep.models.presets.PRESETS key (the h200 scale)
    micro_batch: int
    checkpoint_level: str     # none | L1 | L2 | L3 | full
    reference: str = "live"   # live | precomputed
    liger_kernel: bool | str = "auto"  # auto: on with CUDA + liger-kernel (the trainer's default)
    lean_ops: bool = True              # the trainer's default
    logp_chunk_tokens: int = 1024  # 0 = naive full-vocabulary logits (TRL-before-1.x-like)
    trl_ref: str | None = None     # key of TRL_REFERENCE this row is compared with
    baseline: str | None = None    # our own config this one changes one lever of
    lever: str = ""                # what this row isolates, for the markdown


CONFIGS: tuple[BenchConfig, ...] = (
    # The six configurations TRL was measured on, most important first, with the trainer's
    # defaults (lean ops on, liger-kernel auto = on there, chunked log-probs, live reference).
    BenchConfig("1b-mb8-none", "llama-3.2-1b", 8, "none", trl_ref="1b-mb8-none"),
    BenchConfig("1b-mb8-full", "llama-3.2-1b", 8, "full", trl_ref="1b-mb8-full",
                baseline="1b-mb8-none", lever="checkpoint full"),
    BenchConfig("1b-mb4-none", "llama-3.2-1b", 4, "none", trl_ref="1b-mb4-none"),
    BenchConfig("8b-mb4-none", "llama-3-8b", 4, "none", trl_ref="8b-mb4-none"),
    BenchConfig("8b-mb4-full", "llama-3-8b", 4, "full", trl_ref="8b-mb4-full",
                baseline="8b-mb4-none", lever="checkpoint full"),
    BenchConfig("8b-mb1-none", "llama-3-8b", 1, "none", trl_ref="8b-mb1-none"),
    # Levers, each against its own baseline (one setting changed).
    BenchConfig("1b-mb8-none-stock", "llama-3.2-1b", 8, "none", liger_kernel=False, lean_ops=False,
                trl_ref="1b-mb8-none", baseline="1b-mb8-none-noliger", lever="lean ops off (stock HF modules)"),
    BenchConfig("1b-mb8-none-noliger", "llama-3.2-1b", 8, "none", liger_kernel=False,
                trl_ref="1b-mb8-none", baseline="1b-mb8-none", lever="liger-kernel off"),
    BenchConfig("1b-mb8-none-precomputed", "llama-3.2-1b", 8, "none", reference="precomputed",
                trl_ref="1b-mb8-none", baseline="1b-mb8-none", lever="reference precomputed"),
    BenchConfig("1b-mb8-L1", "llama-3.2-1b", 8, "L1", trl_ref="1b-mb8-none",
                baseline="1b-mb8-none", lever="checkpoint L1"),
    BenchConfig("1b-mb8-L2", "llama-3.2-1b", 8, "L2", trl_ref="1b-mb8-none",
                baseline="1b-mb8-none", lever="checkpoint L2"),
    BenchConfig("1b-mb8-L3", "llama-3.2-1b", 8, "L3", trl_ref="1b-mb8-none",
                baseline="1b-mb8-none", lever="checkpoint L3"),
    BenchConfig("1b-mb8-none-naive-logps", "llama-3.2-1b", 8, "none", logp_chunk_tokens=0,
                trl_ref="1b-mb8-none", baseline="1b-mb8-none",
                lever="logp_chunk_tokens 0 (naive) instead of 1024"),
)
CONFIGS_BY_NAME = {c.name: c for c in CONFIGS}
TRL_CONFIG_NAMES: tuple[str, ...] = tuple(c.name for c in CONFIGS[:6])


@dataclass(frozen=True)
class TrlReference:
    """One row of TRL 1.16 DPOTrainer's table in the issue (one H200, bf16, live reference)."""

    shape: str
    micro_batch: int
    checkpointing: str
    step_ms: float
    tokens_per_s: float
    peak_gib: float  # NVML device-used peak, GiB

    @property
    def peak_gb(self) -> float:
        return self.peak_gib * GIB / GB


TRL_REFERENCE: dict[str, TrlReference] = {
    "1b-mb8-none": TrlReference("Llama-3.2-1B", 8, "none", 378, 43_400, 40.3),
    "1b-mb8-full": TrlReference("Llama-3.2-1B", 8, "full (HF)", 443, 37_000, 15.7),
    "1b-mb4-none": TrlReference("Llama-3.2-1B", 4, "none", 202, 40_600, 26.2),
    "8b-mb4-none": TrlReference("Llama-3-8B", 4, "none", 1_030, 7_950, 117.6),
    "8b-mb4-full": TrlReference("Llama-3-8B", 4, "full (HF)", 1_200, 6_830, 78.7),
    "8b-mb1-none": TrlReference("Llama-3-8B", 1, "none", 325, 6_300, 83.6),
}

#: The issue's goals, per config: (max NVML peak ratio vs TRL, min tokens/s ratio vs TRL).
GOALS: dict[str, tuple[float | None, float | None]] = {
    "1b-mb8-none": (0.70, 1.05),
    "1b-mb8-full": (0.95, 1.05),
    "1b-mb4-none": (None, 1.05),
    "8b-mb4-none": (0.85, 1.00),
    "8b-mb4-full": (0.95, 1.00),
    "8b-mb1-none": (None, 1.00),
}


# --- scales ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scale:
    """Sequence length and step counts. ``h200`` is the measurement; ``tiny`` tests plumbing."""

    name: str
    prompt_tokens: int    # + BOS
    response_tokens: int  # + EOS
    steps: int
    warmup_steps: int
    tiny_model: bool      # swap every preset for tiny-llama
    precision: str = "bf16"  # tiny: fp32, since bf16 matmuls crawl on most CPUs

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + 1 + self.response_tokens + 1

    def preset(self, cfg: BenchConfig) -> str:
        return "tiny-llama" if self.tiny_model else cfg.preset

    def pairs(self, cfg: BenchConfig) -> int:
        """Exactly enough pairs for ``steps`` optimizer steps at grad_acc 1."""
        return cfg.micro_batch * self.steps


SCALES: dict[str, Scale] = {
    "h200": Scale("h200", prompt_tokens=511, response_tokens=511, steps=8, warmup_steps=3, tiny_model=False),
    "tiny": Scale("tiny", prompt_tokens=15, response_tokens=15, steps=2, warmup_steps=1, tiny_model=True,
                  precision="fp32"),
}


def select_configs(spec: str | None, allowed: Iterable[str] | None = None) -> list[BenchConfig]:
    """``--configs a,b`` -> those configs in priority order; None/'all' -> every allowed one."""
    names = list(allowed) if allowed is not None else [c.name for c in CONFIGS]
    if not spec or spec == "all":
        return [CONFIGS_BY_NAME[n] for n in names]
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(unknown)}; choose from: {', '.join(names)}")
    return [CONFIGS_BY_NAME[n] for n in names if n in wanted]


# --- budget and subprocesses -----------------------------------------------------------------

class Budget:
    """Wall-clock budget: stop *starting* configs once it is spent."""

    def __init__(self, max_minutes: float | None, clock=time.monotonic):
        self._clock = clock
        self._deadline = None if max_minutes is None else clock() + max_minutes * 60

    def remaining_s(self) -> float:
        return math.inf if self._deadline is None else self._deadline - self._clock()


@dataclass(frozen=True)
class ProcResult:
    returncode: int
    wall_s: float
    timed_out: bool
    output_tail: str


def run_with_timeout(cmd: list[str], timeout_s: float, log_path: Path, env: dict[str, str] | None = None
                     ) -> ProcResult:
    """Run ``cmd`` in a fresh process (its own session) under coreutils ``timeout``.

    Output goes to ``log_path``. ``timeout`` sends SIGTERM at the limit and SIGKILL 10 s later;
    Python's own timeout backs it up by killing the process group.
    """
    timeout_s = max(1, int(timeout_s))
    full = (["timeout", "-k", "10", str(timeout_s)] if shutil.which("timeout") else []) + cmd
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    timed_out = False
    with log_path.open("w") as log:
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s + 20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            timed_out = True
    timed_out = timed_out or rc in (124, 137)
    text = log_path.read_text(errors="replace")
    return ProcResult(rc, time.monotonic() - t0, timed_out, text[-4000:])


def child_failure(proc: ProcResult, timeout_s: float) -> dict[str, str]:
    """``status`` and ``error`` of a child that left no result: killed at its limit or exited."""
    if proc.timed_out:
        return {"status": "timeout", "error": f"killed after {timeout_s:.0f} s (timeout)"}
    return {"status": "error", "error": f"exit {proc.returncode}: {last_error_line(proc.output_tail)}"}


def command_line(argv: list[str] | None) -> str:
    """How this script was started, for the run's meta file (``argv`` None: sys.argv)."""
    return "python3 " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))


def child_env() -> dict[str, str]:
    """The environment of a child: the checkout first on PYTHONPATH (runs from source)."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def last_error_line(text: str) -> str:
    """The last line that looks like an error in a child's output (for the CSV's error column)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Killed" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else ""


# --- rows ------------------------------------------------------------------------------------

#: Columns both benchmarks write: the benchmark's own first, then results.csv's columns.
BENCH_COLUMNS: list[str] = [
    "config", "trainer", "preset", "reference_mode", "liger_kernel", "lean_ops", "logp_chunk_tokens",
    "peak_mem_gib", "peak_mem_all_steps_gb", "wall_s", "gpu_name", "scale",
]
CSV_COLUMNS: list[str] = BENCH_COLUMNS + [c for c in RESULTS_COLUMNS if c not in BENCH_COLUMNS]


def base_row(cfg: BenchConfig, scale: Scale, trainer: str, gpu: str) -> dict[str, Any]:
    """The identifying part of a row, filled in before the run (so a failure still has it)."""
    return {
        "config": cfg.name, "trainer": trainer, "preset": scale.preset(cfg),
        "reference_mode": cfg.reference, "liger_kernel": cfg.liger_kernel, "lean_ops": cfg.lean_ops,
        "logp_chunk_tokens": cfg.logp_chunk_tokens, "gpu_name": gpu, "scale": scale.name,
        "trial_id": cfg.name, "model": scale.preset(cfg), "seq_len": scale.seq_len,
        "micro_batch": cfg.micro_batch, "checkpoint_level": cfg.checkpoint_level, "grad_acc": 1,
        "beta": 0.1, "num_workers": 1, "effective_batch": cfg.micro_batch, "reference": cfg.reference,
        "steps": scale.steps,
    }


def start_csv(path: Path, append: bool) -> None:
    """A new run starts a new file (header only) unless ``append``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if append and path.exists() and path.stat().st_size > 0:
        return
    with path.open("w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=CSV_COLUMNS).writeheader()


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one finished config (written at once, so a later timeout keeps it)."""
    if not path.exists() or path.stat().st_size == 0:
        start_csv(path, append=False)
    with path.open("a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore").writerow(
            {c: row.get(c, "") for c in CSV_COLUMNS})
        fh.flush()
        os.fsync(fh.fileno())


def num(value: Any) -> float:
    """A CSV cell as a float (nan when empty or not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def gpu_name() -> str:
    """The GPU's name without creating a CUDA context here (that would sit in every NVML peak)."""
    try:
        with nvml_session() as nvml:
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no NVML: no GPU, or a broken driver; say so
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "no GPU (CPU run)"
