"""Fixtures of the model-family tests (test_family_head.py, test_parity.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from family_checkpoints import save_family_checkpoint


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on one torch thread: more only wait on each other (and on other processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def family_folder(tmp_path_factory):
    """``get(model_type, head_scale=1.0, dropout=0.0)``: a checkpoint folder of that family
    (tests/family_checkpoints.py), saved on first use and kept for the module."""
    made: dict[tuple[str, float, float], Path] = {}

    def get(model_type: str, head_scale: float = 1.0, dropout: float = 0.0) -> Path:
        key = (model_type, head_scale, dropout)
        if key not in made:
            made[key] = save_family_checkpoint(model_type, tmp_path_factory.mktemp(model_type), head_scale=head_scale,
                                               dropout=dropout)
        return made[key]

    return get
