"""Files written whole or not at all, and text read as a spreadsheet may have saved it.

Every output file of a results folder is replaced atomically (:func:`write_text_atomic`), a CSV
append is cut back when it fails (:func:`append_text`), and a results file's text is UTF-8 with a
byte-order mark allowed (:func:`read_text`): a full disk, a read-only folder or a kill never
leaves a cut file, and another encoding is refused with the fix. Imports nothing of the package
but its errors, so producers and consumers both use it.
"""
from __future__ import annotations

import codecs
import os
from pathlib import Path

from dpo_sweep.errors import UserError


def read_text(path: str | Path) -> str:
    """A results file's text: UTF-8, with the byte-order mark a spreadsheet may put first dropped.
    Another encoding (Latin-1, UTF-16: "CSV" or "Unicode text" of a spreadsheet) is refused with
    the fix: the columns of such a file would not read as their names."""
    data = Path(path).read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise UserError(f"{path}: UTF-16 text (a spreadsheet's \"Unicode text\"); save it as \"CSV UTF-8\" "
                        "(comma-separated), or re-run the sweep to rewrite it")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UserError(f"{path}: not UTF-8 text (line {line}, byte {err.start}: a spreadsheet saved it in "
                        "another encoding); save it as \"CSV UTF-8\", or re-run the sweep to rewrite it") from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) whole or not at all: written beside it, flushed to
    disk, then moved over it. A full disk or a kill mid-write leaves the old file (or none), never
    a cut one; the partial file is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        with tmp.open("w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:
            raise OSError(err.errno, err.strerror, str(path)) from None  # the message names the file
        raise


def append_text(path: Path, text: str) -> None:
    """Append ``text`` (UTF-8) in one write; when it fails (a full disk, a read-only file system)
    the file is cut back to its length before, so that no part of it is left at the end."""
    data = text.encode("utf-8")
    size = path.stat().st_size
    try:
        with path.open("ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        try:
            os.truncate(path, size)
        except OSError:
            pass  # read-only now: nothing was appended either
        raise OSError(err.errno, err.strerror, str(path)) from None


#: Free space below which a sweep stops writing (its rows and Ray Tune's state files would not fit).
MIN_FREE_BYTES = 16_000_000


def unwritable(folder: Path) -> str | None:
    """Why nothing more can be written under ``folder`` (its file system read-only, or less than
    MIN_FREE_BYTES free), in one line; None when it can be."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None  # not there yet: its writer says what fails
    if st.f_flag & os.ST_RDONLY:
        return f"{folder}: the file system is read-only"
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        return f"{folder}: the disk is full ({free / 1e6:.1f} MB free)"
    return None
