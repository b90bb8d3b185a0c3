"""Fixtures every test module may use (a real redis-server, a session's Ray), the Hypothesis
profiles, and the markers that follow from fixtures. Helpers are in ``workloads.py`` (random
workloads, the oracle's mirror) and ``clusters.py`` (the clusters tests run)."""

from __future__ import annotations

import contextlib
import gc
import os
import warnings

import pytest
from hypothesis import HealthCheck, settings

from deploy.redis_local import RedisServer

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(items):
    """The markers (declared in pyproject.toml) that follow from a test's fixtures: a test of
    the ``redis_url`` fixture or of the whole cluster (``e2e``) needs a redis-server (``redis``);
    one of ``ray_session`` real Ray actors (``ray``)."""
    for item in items:
        if "redis_url" in item.fixturenames or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.redis)
        if "ray_session" in item.fixturenames:
            item.add_marker(pytest.mark.ray)


@contextlib.contextmanager
def _ray_noise_ignored():
    """Ray's start and stop warn about things that are not ours: a "Tip" about GPU environment
    variables, and /dev/null handles and process objects its node launcher leaves to the garbage
    collector. Collect them here, where those warnings are ignored, not in some later test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by every test of the session, started on first use (the modules that
    launch clusters import Ray with ``shard.host.actor``; the others never load it)."""
    import ray

    started = not ray.is_initialized()
    if started:
        with _ray_noise_ignored():
            ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    if started:
        with _ray_noise_ignored():
            ray.shutdown()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A private redis-server (a real one) for the tests of one module."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server.url
    server.stop()
