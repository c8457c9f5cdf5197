"""Shared fixtures: small trial configs on the tiny preset, CPU only unless a test says gpu."""
from __future__ import annotations

import pytest
import torch

from testkit import make_cfg


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cfg_factory():
    """``cfg_factory(micro_batch=4, steps=3, ...)`` -> TrialConfig (see make_cfg)."""
    return make_cfg
