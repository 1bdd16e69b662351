"""Fixtures shared by several test modules."""

import os
import tempfile

import pytest

# One Ray auth mode for every in-process Ray of the test run: Ray reads RAY_AUTH_MODE once per process, and a
# driver left in token mode by an earlier local Ray cannot start actors on a later one in "disabled" mode.
# Subprocess tests choose their own (tests/test_ray_security.py runs with Ray's default, token auth on).
os.environ["RAY_AUTH_MODE"] = "disabled"


@pytest.fixture(scope="module")
def ray_session():
    """One quiet local Ray for a test module (an already running one is used and left running)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    from search_spaces.ray_session import start_local

    started = not ray.is_initialized()
    if started:  # the one way autotune starts Ray: every port on 127.0.0.1
        start_local(num_cpus=2, temp_dir=tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield
    if started:
        ray.shutdown()
