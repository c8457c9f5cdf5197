"""A CSV file of the results folder read record by record, each checked whole: what a kill or a
full disk during an append leaves (a cut-off last line) is a damaged record, never a row."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from dpo_sweep.errors import UserError
from dpo_sweep.files import read_text
from dpo_sweep.text import excerpt


@dataclass(frozen=True)
class DamagedLine:
    """A record of a CSV file that is no whole row: what a kill or a full disk during an append
    leaves (a cut-off last line), or a hand edit that lost or added a comma."""

    line: int      # the file line it starts on (a quoted cell may span lines)
    trial_id: str  # its first cell, as far as it goes ("" when there is none)
    reason: str

    def text(self) -> str:
        return f"line {self.line}" + (f" (trial {self.trial_id})" if self.trial_id else "") + f": {self.reason}"


@dataclass(frozen=True)
class CsvTable:
    """A CSV file read record by record: the header, the whole rows, and the damaged ones."""

    header: list[str]
    rows: list[dict[str, str]]
    damaged: list[DamagedLine]


def read_csv_table(path: str | Path) -> CsvTable:
    """``path`` with every record checked: a row must have exactly the header's cells, and the
    file must end with the line break the writers put after every row (else its last line was
    cut, maybe inside a cell: ``4061`` cut to ``40`` looks whole). Blank lines are no rows."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return CsvTable([], [], [])
    text = read_text(path)
    header: list[str] | None = None
    rows: list[dict[str, str]] = []
    damaged: list[DamagedLine] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    start, records = 1, []
    try:
        for record in reader:
            records.append((start, record))
            start = reader.line_num + 1
    except csv.Error as err:
        raise UserError(f"{path}: line {start} cannot be read as CSV ({excerpt(str(err), 200)}); "
                        "correct or delete that line, or re-run the sweep to rewrite the file") from None
    for i, (line, record) in enumerate(records):
        if not record or (len(record) == 1 and not record[0].strip()):
            continue
        if header is None:
            header = record
            continue
        reasons = []
        if len(record) != len(header):
            reasons.append(f"it has {len(record)} of the header's {len(header)} cells")
        if i == len(records) - 1 and not text.endswith(("\n", "\r")):
            reasons.append("the file ends inside it (no line break after it)")
        if reasons:
            damaged.append(DamagedLine(line, record[0].strip(), " and ".join(reasons)))
        else:
            rows.append(dict(zip(header, record)))
    return CsvTable(header or [], rows, damaged)


def damaged_text(path: str | Path, damaged: list[DamagedLine]) -> str:
    """One sentence naming every damaged record of ``path``."""
    return f"{path}: " + "; ".join(d.text() for d in damaged)
