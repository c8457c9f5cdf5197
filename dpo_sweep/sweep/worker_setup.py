"""The set-up of a sweep's worker processes: Ray's ``worker_process_setup_hook``, run at the start
of every worker process of a sweep's job (:func:`quiet_ray_train_logs`), and the imports a warm
worker and the preflight's process leave out (:func:`unused_packages_hidden`).

Kept to the standard library: it runs in every process Ray starts for the sweep, most of which
never touch torch.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

#: Ray Train's placement-group cleaner asks the state API once a second whether the trial's
#: controller is alive. Without a dashboard (``--no-dashboard``, minimal Ray installs) there is no
#: state API, and every question logged "Failed to query Ray Train Controller actor state" to the
#: sweep's console, burying its progress lines. Its errors still show.
NOISY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)


def quiet_ray_train_logs() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


#: Packages that transformers imports when they are installed and that no trial uses:
#: scikit-learn, which transformers 5.17 imports with its generation code for assisted
#: generation (with pandas and scipy, a sixth of a warm worker's imports:
#: benchmarks/README.md#start-up-and-shutdown).
UNUSED_PACKAGES = ("sklearn",)


@contextlib.contextmanager
def unused_packages_hidden() -> Iterator[None]:
    """Within the block the packages of :data:`UNUSED_PACKAGES` look uninstalled to what is imported:
    ``importlib.util.find_spec`` gives None and an import raises ImportError. transformers keeps
    the answer of its availability checks (they are cached), so it does not import them later
    either; code of our own or a user's that imports one after the block gets it as usual. A
    package already imported stays as it is."""
    hidden = [name for name in UNUSED_PACKAGES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment] - the import system's "not there"
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
