"""The results folder's layout: the one place that spells its file names (the results-directory
contract in docs/contracts.md#the-results-folder).

Producers (the sweep, the trainer, the preflight) write these files and consumers (the analyser,
the report) read them, so the module imports nothing of the package: either side may import it.
A name is also a class attribute (``ResultsDir.RESULTS``) for messages that name a file without a
folder, such as a budget's source.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class ResultsDir:
    """``ResultsDir(out_dir).results`` is ``out_dir/results.csv``, and so on for every file."""

    RESULTS: ClassVar[str] = "results.csv"  # one row per trial (records.TrialResult)
    STEPS: ClassVar[str] = "steps.csv"  # one row per trial per optimizer step (records.StepRecord)
    SPACE: ClassVar[str] = "space.yaml"  # the sweep's space file, as it ran (--set applied)
    DATA: ClassVar[str] = "data.json"  # the data's length histograms (core.lengths)
    ENVIRONMENT: ClassVar[str] = "environment.json"  # the machine (telemetry.environment_info)
    LOGS: ClassVar[str] = "logs"  # the training workers' output, one file per trial and rank
    FRONTIER: ClassVar[str] = "frontier.md"
    RECOMMENDATION: ClassVar[str] = "recommendation.json"
    RECOMMENDED: ClassVar[str] = "recommended.yaml"  # the winner as a space file of one trial
    REPORT: ClassVar[str] = "report.html"
    LOCK: ClassVar[str] = ".sweep.lock"  # held by the one sweep writing the folder (sweep.folder_lock)
    PREVIOUS: ClassVar[str] = "previous-"  # prefix of the folder a fresh run moves earlier results to
    #: The files ``trial`` and ``run`` write rows into.
    ROW_FILES: ClassVar[tuple[str, ...]] = (RESULTS, STEPS)
    #: The files the analysis writes from the rows (``report DIR`` writes them again).
    ANALYSIS_FILES: ClassVar[tuple[str, ...]] = (FRONTIER, RECOMMENDATION, RECOMMENDED, REPORT)

    __slots__ = ("root",)

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"ResultsDir({str(self.root)!r})"

    @property
    def results(self) -> Path:
        return self.root / self.RESULTS

    @property
    def steps(self) -> Path:
        return self.root / self.STEPS

    @property
    def space(self) -> Path:
        return self.root / self.SPACE

    @property
    def data(self) -> Path:
        return self.root / self.DATA

    @property
    def environment(self) -> Path:
        return self.root / self.ENVIRONMENT

    @property
    def logs(self) -> Path:
        return self.root / self.LOGS

    @property
    def frontier(self) -> Path:
        return self.root / self.FRONTIER

    @property
    def recommendation(self) -> Path:
        return self.root / self.RECOMMENDATION

    @property
    def recommended(self) -> Path:
        return self.root / self.RECOMMENDED

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def lock(self) -> Path:
        return self.root / self.LOCK

    @property
    def row_files(self) -> tuple[Path, ...]:
        return tuple(self.root / name for name in self.ROW_FILES)

    @property
    def analysis_files(self) -> tuple[Path, ...]:
        return tuple(self.root / name for name in self.ANALYSIS_FILES)

    def previous(self, stamp: str) -> Path:
        """``previous-<stamp>/``: where a run without ``--resume`` moves the earlier rows."""
        return self.root / f"{self.PREVIOUS}{stamp}"

    @staticmethod
    def log_name(trial_id: str, rank: int) -> str:
        """A worker's file under ``logs/``: ``<trial_id>.log`` for rank 0, ``<trial_id>.rank<N>.log``
        for the others."""
        return f"{trial_id}.log" if rank == 0 else f"{trial_id}.rank{rank}.log"

    def worker_log(self, trial_id: str, rank: int) -> Path:
        return self.logs / self.log_name(trial_id, rank)
