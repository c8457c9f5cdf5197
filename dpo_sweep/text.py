"""Bounded excerpts of values for messages: an error quotes at most a few hundred characters of
whatever the user gave (a 50 MB YAML value, a cell of a damaged CSV), never all of it."""
from __future__ import annotations

import reprlib
from typing import Any

#: Characters of a value a message quotes.
EXCERPT_CHARS = 200

_REPR = reprlib.Repr()
_REPR.maxstring = EXCERPT_CHARS
_REPR.maxother = EXCERPT_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlevel = 3


def excerpt(text: str, max_chars: int = EXCERPT_CHARS) -> str:
    """``text`` cut to ``max_chars`` (``...`` and the length left out say it was cut)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... ({len(text) - max_chars:,} more characters)"


def shown(value: Any, max_chars: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` of at most about ``max_chars`` characters, built without the whole repr of
    a huge value (nested lists and mappings are cut by depth and length as well)."""
    return excerpt(_REPR.repr(value), max_chars)
