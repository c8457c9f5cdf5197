"""Errors that are the user's to fix: the CLI prints them without a traceback and exits 2."""


class UserError(ValueError):
    """Bad input (space file, arguments, data). The message names the field, value and fix."""


class SpaceError(UserError):
    """An invalid search-space file or ``--set`` override."""


class DataError(UserError):
    """Preference data that cannot be used: missing columns, empty file, nothing left."""
