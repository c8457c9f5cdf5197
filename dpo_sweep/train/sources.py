"""Preference data read as rows: a .json, .jsonl or .parquet file, or a Hugging Face dataset
split, as plain dicts with where each row sits in its source (for messages that name the line).

Reading only: :mod:`dpo_sweep.train.data` normalises, tokenizes and truncates the rows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dpo_sweep.config import DataSpec
from dpo_sweep.errors import DataError


@dataclass(frozen=True)
class SourceRows:
    """Rows of a data file or hub dataset as plain dicts, and where each one sits, for messages.

    ``numbers[i]`` is row i's 1-based position in its source: the line of a JSONL file (blank
    lines are skipped, so it is not always i + 1), the element of a .json list, the row of a
    parquet file or dataset split.
    """

    rows: list[dict[str, Any]]
    source: str
    unit: str  # "line" | "element" | "row"
    numbers: tuple[int, ...]

    def where(self, i: int) -> str:
        """``pairs.jsonl: line 8`` (a line is what an editor shows); 0-based index said for the rest."""
        n = self.numbers[i]
        return f"{self.source}: {self.unit} {n}" + ("" if self.unit == "line" else f" (index {n - 1})")


def read_rows(spec: DataSpec) -> SourceRows:
    """The rows of a data spec's file or hub dataset."""
    if spec.path is not None:
        return read_file(spec.path)
    import datasets

    name = spec.hf or ""
    try:
        ds = datasets.load_dataset(name, spec.hf_config, split=spec.split)
    except Exception as err:  # the hub unreachable, a wrong name or split: the user's to fix
        raise DataError(
            f"data.hf: could not load dataset {name!r} (split {spec.split!r}): {err}. "
            "Check the name and split, or download it and use data.path"
        ) from None
    rows = [dict(r) for r in ds]
    return _checked(SourceRows(rows, f"{name}[{spec.split}]", "row", tuple(range(1, len(rows) + 1))))


def _read_text(p: Path, path: str | Path) -> str:
    # utf-8-sig: a leading byte-order mark (Windows editors write one) is dropped, not an error.
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        line = p.read_bytes()[: err.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: not UTF-8 text ({err.reason}); save the file as UTF-8") from None


#: The longest line a .jsonl file may hold (bytes): one preference pair, prompt and both answers,
#: is far shorter; a longer line is refused with its number before it is parsed or tokenized.
MAX_JSONL_LINE_BYTES = 1_000_000


def _jsonl_lines(p: Path, path: str | Path) -> Iterator[tuple[int, str]]:
    """The file's lines and their numbers, read one at a time, none over :data:`MAX_JSONL_LINE_BYTES`
    (memory bounded: an over-long line is refused once its first megabyte is read)."""
    with p.open("rb") as fh:
        # Lines end at b"\n" only: a JSON string may hold U+2028 and other separators raw.
        for n, raw in enumerate(iter(lambda: fh.readline(MAX_JSONL_LINE_BYTES + 2), b""), start=1):
            if len(raw.rstrip(b"\r\n")) > MAX_JSONL_LINE_BYTES:
                raise DataError(f"{path}: line {n}: longer than {MAX_JSONL_LINE_BYTES:,} bytes, the most a line "
                                "may hold; each line holds one pair object (shorten or drop that pair)")
            try:
                # utf-8-sig on the first line: a leading byte-order mark (Windows editors) is dropped.
                yield n, raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: line {n}: not UTF-8 text ({err.reason}); save the file as UTF-8") from None


def _read_jsonl(p: Path, path: str | Path) -> SourceRows:
    rows, numbers = [], []
    for n, line in _jsonl_lines(p, path):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: line {n}: not valid JSON ({err.msg} at column {err.colno}); "
                            "each line holds one pair object") from None
        numbers.append(n)
    return SourceRows(rows, str(path), "line", tuple(numbers))


def _read_json(p: Path, path: str | Path) -> SourceRows:
    try:
        data = json.loads(_read_text(p, path) or "null")
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: line {err.lineno} column {err.colno}: not valid JSON ({err.msg}); "
                        "a .json file holds a list of pair objects") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if data is None:
        data = []
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of pair objects (or {{\"data\": [...]}}), got "
                        f"{type(data).__name__}; for one pair per line use a .jsonl file")
    return SourceRows(data, str(path), "element", tuple(range(1, len(data) + 1)))


def _read_parquet(p: Path, path: str | Path) -> SourceRows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(p).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable parquet file ({err}); write it with "
                        "pandas.DataFrame.to_parquet or use .jsonl") from None
    return SourceRows(rows, str(path), "row", tuple(range(1, len(rows) + 1)))


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def read_file(path: str | Path) -> SourceRows:
    """Rows of a .json (a list of objects, or {"data": [...]}), .jsonl or .parquet file."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise DataError(f"data.path: {path}: not a regular file (a directory, pipe or device); give a .json, "
                        ".jsonl or .parquet file")
    if not p.is_file():
        raise DataError(f"data.path: {path}: no such file; give an existing .json, .jsonl or .parquet "
                        "file (a relative path is taken from the directory the command runs in)")
    reader = _READERS.get(p.suffix.lower())
    if reader is None:
        raise DataError(f"data.path: {path}: unsupported file type {p.suffix.lower()!r}; use .json, .jsonl or .parquet")
    return _checked(reader(p, path))


def _checked(src: SourceRows) -> SourceRows:
    """Refuse a source with no rows, or a row that is not an object."""
    if not src.rows:
        raise DataError(
            f"{src.source}: the file holds no pairs; it needs rows with 'chosen' and 'rejected' "
            "(and optionally 'prompt')"
        )
    for i, r in enumerate(src.rows):
        if not isinstance(r, dict):
            raise DataError(f"{src.where(i)}: expected an object with chosen/rejected, got {type(r).__name__}")
    return src
