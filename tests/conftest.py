"""Fixtures shared by several test modules."""

import os
import tempfile

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One quiet local Ray for a test module (an already running one is used and left running)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 _temp_dir=tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield
    if started:
        ray.shutdown()
