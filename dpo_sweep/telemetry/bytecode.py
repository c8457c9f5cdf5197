"""Whether this machine's Python compiles the heavy packages from source in every process.

Python keeps a module's compiled bytecode in ``__pycache__`` (or under ``PYTHONPYCACHEPREFIX``)
and reads it on the next import. Where the install shipped without it (``pip install
--no-compile``, some container images) and Python may not write it (``PYTHONDONTWRITEBYTECODE=1``
or ``-B``; or a read-only install), every process compiles torch's and transformers' sources
again: each warm worker of a sweep, as it starts, which can double its imports
(benchmarks/README.md#start-up-and-shutdown).

:func:`uncached_imports` counts, after the imports, the modules left without bytecode;
:func:`bytecode_note` turns that into the console's note with the command that ends it.
``dpo-sweep run``'s preflight process asks, once its imports (the workers' own) are done
(:func:`dpo_sweep.sweep.startup.check_inputs`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Mapping

#: A package is named in the note from this many modules without bytecode (a few are noise: a
#: checkout's own modules, a package that writes files at run time).
MIN_UNCACHED = 100


def uncached_imports(modules: Mapping[str, ModuleType] | None = None) -> dict[str, tuple[int, Path]]:
    """Per top-level package of ``modules`` (default ``sys.modules``): how many of its imported
    modules were compiled from their source without bytecode left behind (no file at their
    ``__spec__.cached``), and the folder the package lives in. Modules loaded from bytecode alone,
    built-ins, extensions and namespace packages have no ``cached`` and are not counted."""
    modules = sys.modules if modules is None else modules
    counts: dict[str, int] = {}
    first_origin: dict[str, str] = {}  # a package without a file of its own lives where its modules do
    for name, module in list(modules.items()):
        spec = getattr(module, "__spec__", None)
        cached, origin = getattr(spec, "cached", None), getattr(spec, "origin", None)
        if cached and origin and str(origin).endswith(".py") and not os.path.exists(cached):
            top = name.partition(".")[0]
            counts[top] = counts.get(top, 0) + 1
            first_origin.setdefault(top, str(origin))
    return {top: (count, _home(getattr(modules.get(top), "__file__", None) or first_origin[top]))
            for top, count in counts.items()}


def _home(file: str) -> Path:
    """The folder a package's ``__init__.py`` is in; a single-file module: its file."""
    return Path(file).parent if file.endswith("__init__.py") else Path(file)


def bytecode_note(uncached: Mapping[str, tuple[int, Path]], dont_write: bool | None = None,
                  min_uncached: int = MIN_UNCACHED) -> str | None:
    """The console's note on ``uncached`` (:func:`uncached_imports`): the packages with at least
    ``min_uncached`` modules without bytecode, why Python keeps none (``dont_write``: this
    Python's ``-B``/``PYTHONDONTWRITEBYTECODE``, default the running one's; else the folders are
    not writable) and the command that compiles them once. None when no package is that large."""
    heavy = sorted(((n, c, home) for n, (c, home) in uncached.items() if c >= min_uncached),
                   key=lambda item: -item[1])
    if not heavy:
        return None
    dont_write = sys.flags.dont_write_bytecode if dont_write is None else dont_write
    names = [n for n, _, _ in heavy]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    why = ("this Python writes none (PYTHONDONTWRITEBYTECODE=1 or -B)" if dont_write
           else "Python cannot write it there (the install's folders are not writable)")
    command = "python -m compileall -q -j 0 " + " ".join(str(home) for _, _, home in heavy)
    fix = (f"compiling them once ends that: {command}" if dont_write
           else f"compiling them once as the install's owner ends that ({command}), or a writable "
                f"PYTHONPYCACHEPREFIX")
    return (f"note: {sum(c for _, c, _ in heavy):,} modules of {listed} have no bytecode and {why}: "
            f"each warm worker compiles them from source as it starts (about half of its imports "
            f"on the H200 we measured); {fix}")
