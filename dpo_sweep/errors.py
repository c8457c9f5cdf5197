"""Errors that are the user's to fix: the CLI prints them without a traceback and exits 2."""

import errno


class UserError(ValueError):
    """Bad input (space file, arguments, data). The message names the field, value and fix."""


class SpaceError(UserError):
    """An invalid search-space file or ``--set`` override."""


class DataError(UserError):
    """Preference data that cannot be used: missing columns, empty file, nothing left."""


#: What a failed write's errno means for the user, and what to do.
_WRITE_FAILURES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def os_error_line(err: OSError) -> str:
    """One line for a file operation that failed (a full disk, a read-only folder): the file and
    the cause in words, never a traceback."""
    cause = _WRITE_FAILURES.get(err.errno or 0, err.strerror or type(err).__name__)
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{cause} ({err.strerror or err})" if err.strerror and cause != err.strerror else f"{where}{cause}"
