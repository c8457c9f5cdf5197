"""The sweep tests' shared Ray head: started once per test run, on first use, and stopped at its end."""
from __future__ import annotations

import pytest
from sweep_cluster import start_head


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """A local Ray head (2 CPUs, dashboard on, token authentication on) for tests that drive
    ``dpo-sweep run --address`` or are refused by it. A test that adds or stops nodes, or reads the
    cluster's whole task history, starts its own with ``start_head``."""
    cluster = start_head(tmp_path_factory.mktemp("ray-head"), num_cpus=2)
    yield cluster
    cluster.stop()
