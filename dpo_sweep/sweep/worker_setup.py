"""Run by Ray at the start of every worker process of a sweep's job (``worker_process_setup_hook``).

Kept to the standard library: it runs in every process Ray starts for the sweep, most of which
never touch torch.
"""
from __future__ import annotations

import logging

#: Ray Train's placement-group cleaner asks the state API once a second whether the trial's
#: controller is alive. Without a dashboard (``--no-dashboard``, minimal Ray installs) there is no
#: state API, and every question logged "Failed to query Ray Train Controller actor state" to the
#: sweep's console, burying its progress lines. Its errors still show.
NOISY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)


def quiet_ray_train_logs() -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
