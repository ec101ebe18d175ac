"""Quarantine and block budget (issue 11) against a real Redis with in-process workers.

A model whose engine raises (any exception, not only NumericalError) is marked ``error`` with the reason
after ``max_block_attempts`` attempts while the other models of the same worker keep absorbing chunks; a
block past ``block_budget_seconds`` is aborted, the model ``degraded`` and parked, the committed state
untouched, and a later run absorbs the block exactly once, bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
import redis
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks, reference_trace, strip
from workers.quarantine import Attempts, attempts_key
from workers.runner import Worker
from workers.segmented import SegmentedEngine
from workers.store.keys import Keys


@contextmanager
def worker_thread(settings):
    """A real worker (``workers.runner.Worker``) in a thread of the test process; stopped on exit."""
    stop = threading.Event()
    w = Worker(settings, stop=stop)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield w, t
    finally:
        stop.set()
        t.join(timeout=120)
        assert not t.is_alive()


@pytest.fixture
def api(settings):
    with TestClient(create_app(settings, workers=0)) as c:
        yield c


def evidence(api, name):
    return api.get(f"/v1/models/{name}/evidence").json()


def create(api, name, stream, model):
    r = api.post("/v1/models", json={"name": name, "stream": stream, **model})
    assert r.status_code == 201, r.text


def post(api, stream, chunk):
    r = api.post(f"/v1/streams/{stream}/chunks", json=chunk)
    assert r.status_code == 202, r.text


def rewrite_config(settings, name, **sampler):
    """Change a model's stored config behind the API (what an older API, or a host without the
    device, lets through): the worker must cope."""
    r = redis.Redis.from_url(settings.redis_url)
    key = Keys(settings.key_prefix).model("default", name)
    cfg = json.loads(r.get(key))
    cfg["sampler"].update(sampler)
    r.set(key, json.dumps(cfg))


def test_an_engine_that_cannot_be_built_is_quarantined_and_others_progress(api, settings):
    """``sampler.device: cuda`` on a CPU host: torch raises RuntimeError when the engine is built."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a host without CUDA")
    create(api, "gpu", "g", SMALL_MODEL)
    create(api, "light", "l", SMALL_MODEL)
    rewrite_config(settings, "gpu", device="cuda")
    chunks = linear_chunks(2, 20, seed=1)
    post(api, "g", chunks[0])
    post(api, "l", chunks[0])
    with worker_thread(settings.model_copy(update={"max_block_attempts": 3})) as (w, t):
        body = wait_until(lambda: (e := evidence(api, "gpu"))["status"] == "error" and e, timeout=60)
        assert "quarantined after 3 failed attempts" in body["error"]
        assert "RuntimeError" in body["error"] and "CUDA" in body["error"]
        assert Attempts(w.r, w.keys, w.id).record("default", "gpu")["attempts"] == "3"
        wait_until(lambda: evidence(api, "light")["chunks_processed"] == 1, timeout=60)
        post(api, "l", chunks[1])  # the worker keeps absorbing other models
        wait_until(lambda: evidence(api, "light")["chunks_processed"] == 2, timeout=60)
        assert t.is_alive()
        assert "default/gpu" not in w.held
    assert evidence(api, "gpu")["status"] == "error"  # for good: no worker leases it again


def test_an_exception_inside_a_block_is_retried_then_quarantined(api, settings, monkeypatch):
    """A MemoryError (not NumericalError/ValueError) raised by the engine on one model's second chunk (the
    second of the worker's batch: the failure is counted at that chunk's cursor): that model goes to ``error``
    after exactly 2 attempts, its first chunk stays committed, the other model on the worker goes on."""
    # the worker advances its models together (workers.segmented.advance_blocks); a model's own failure is
    # injected where its block is prepared, inside that stacked call
    before_block = SegmentedEngine._before_block
    calls = []

    def failing(self, *args, **kwargs):
        if self.settings.seed == 666 and self.observations >= 20:
            calls.append(1)
            raise MemoryError("injected: cannot allocate the likelihood intermediates")
        return before_block(self, *args, **kwargs)

    monkeypatch.setattr(SegmentedEngine, "_before_block", failing)
    bad = {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "seed": 666}}
    create(api, "bad", "s", bad)
    create(api, "good", "s", SMALL_MODEL)
    chunks = linear_chunks(3, 20, seed=2)
    post(api, "s", chunks[0])
    post(api, "s", chunks[1])
    with worker_thread(settings.model_copy(update={"max_block_attempts": 2})) as (_, t):
        body = wait_until(lambda: (e := evidence(api, "bad"))["status"] == "error" and e, timeout=60)
        assert body["error"].startswith("quarantined after 2 failed attempts")
        assert "MemoryError: injected" in body["error"]
        assert body["chunks_processed"] == 1 and body["observations"] == 20
        post(api, "s", chunks[2])
        wait_until(lambda: evidence(api, "good")["chunks_processed"] == 3, timeout=60)
        assert t.is_alive()
    assert len(calls) == 2
    trace = api.get("/v1/models/good/trace", params={"limit": 1000}).json()["items"]
    assert strip(trace) == strip(reference_trace(SMALL_MODEL, chunks))


# linear regression, 20 rows, 2,000 particles, moves after every annealing step (also a first block taken in one
# step): 14 annealing steps x 3,000 SGHMC steps, 9 s on this 2-core host when quiet (engine v2 with adaptive moves,
# session 6), more when loaded: far beyond the 1 s budget below on any machine this suite runs on.
SLOW_SAMPLER = {
    "particles": 2000,
    "warmup_particles": 2000,
    "batch_size": 20,
    "burn_in": 3000,
    "moves": "every_step",
    "seed": 4,
}
SLOW_MODEL = {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], **SLOW_SAMPLER}}


@pytest.mark.slow
def test_a_block_over_budget_is_aborted_degraded_and_later_absorbed_exactly_once(api, settings):
    create(api, "slow", "s", SLOW_MODEL)
    create(api, "light", "s", SMALL_MODEL)
    chunks = linear_chunks(2, 20, seed=3)
    budgeted = settings.model_copy(
        update={"block_budget_seconds": 1.0, "block_budget_cooldown_seconds": 3600.0, "lease_ttl_seconds": 30.0}
    )
    r = redis.Redis.from_url(settings.redis_url)
    akey = attempts_key(Keys(settings.key_prefix), "default", "slow")
    post(api, "s", chunks[0])
    with worker_thread(budgeted) as (w, t):
        body = wait_until(lambda: (e := evidence(api, "slow"))["status"] == "degraded" and e, timeout=120)
        assert "block budget of 1 s" in body["error"] and "parked" in body["error"]
        # the abort left the committed state as it was
        assert body["chunks_processed"] == 0 and body["observations"] == 0
        assert api.get("/v1/models/slow/trace").json()["items"] == []
        # the worker moved on: the light model absorbs this chunk and the next
        wait_until(lambda: evidence(api, "light")["chunks_processed"] == 1, timeout=60)
        post(api, "s", chunks[1])
        wait_until(lambda: evidence(api, "light")["chunks_processed"] == 2, timeout=60)
        record = {k.decode(): v.decode() for k, v in r.hgetall(akey).items()}
        assert record["overruns"] == "1" and record["attempts"] == "0"  # an overrun is not a failed attempt
        assert "default/slow" not in w.held  # parked: not leased again during the cool-down
        assert evidence(api, "slow")["chunks_processed"] == 0
        assert t.is_alive()
    # The cool-down is over (set here rather than waited for) and the budget is larger: the same blocks,
    # from the same checkpoint and generator state, give the bits of an uninterrupted run, each once.
    r.hset(akey, "parked_until", "0")
    with worker_thread(settings.model_copy(update={"block_budget_seconds": 600.0, "lease_ttl_seconds": 60.0})):
        wait_until(lambda: evidence(api, "slow")["chunks_processed"] == 2, timeout=300)
    body = evidence(api, "slow")
    assert body["status"] == "ok" and body["error"] is None
    trace = api.get("/v1/models/slow/trace", params={"limit": 1000}).json()["items"]
    assert strip(trace) == strip(reference_trace(SLOW_MODEL, chunks))


class Crash(BaseException):
    """The worker process dying mid-restore: not an ``Exception``, so nothing of the worker's handles it."""


def test_a_worker_killed_while_loading_a_batch_quarantines_only_the_culprit(api, settings, monkeypatch):
    """The models one scan leases are restored together (``Worker.load_many``): a worker that dies building one of
    them leaves an unfinished restore attempt on each.  The next workers load those models one at a time, so the
    culprit, which kills them again, is quarantined after ``max_block_attempts`` and the innocent ones are not
    (loading them together again would count a second attempt against each, and the third worker would quarantine
    all three)."""
    for name in ("a", "c", "p"):
        seed = 666 if name == "p" else 3
        create(api, name, "s", {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "seed": seed}})
    init = SegmentedEngine.__init__

    def crashing_init(self, main, cps=None):
        if main.settings.seed == 666:
            raise Crash
        init(self, main, cps)

    monkeypatch.setattr(SegmentedEngine, "__init__", crashing_init)
    s = settings.model_copy(update={"max_block_attempts": 2})
    attempts = Attempts(redis.Redis.from_url(settings.redis_url), Keys(settings.key_prefix), "test")
    for crashes in (True, True, False):  # the second worker dies on the culprit alone, the third quarantines it
        w = Worker(s)
        w.heartbeat()
        if crashes:
            with pytest.raises(Crash):
                w.scan()
            for name in ("a", "c", "p"):  # the process is gone: its leases and heartbeat lapse
                w.r.delete(w.keys.lease("default", name))
            w.r.delete(w.keys.worker(w.id))
            w.r.zrem(w.keys.workers, w.id)
        else:
            w.scan()
    assert sorted(w.held) == ["default/a", "default/c"]
    body = evidence(api, "p")
    assert body["status"] == "error" and "quarantined after 2 failed attempts" in body["error"], body
    assert attempts.record("default", "a")["attempts"] == "1"  # the first worker's, never given back
    post(api, "s", linear_chunks(1, 20, seed=1)[0])
    while w.step():
        pass
    for name in ("a", "c"):
        assert evidence(api, name)["status"] == "ok"
        assert evidence(api, name)["chunks_processed"] == 1


def test_attempts_of_many_models_are_counted_in_one_call_each_on_its_own(settings):
    """Attempts.begin_many counts the attempts of many models in few script calls (ATTEMPTS_PER_SCRIPT each), each
    model fenced by its own lease and answered on its own: a lost lease and a model out of attempts write nothing, a
    model whose record raises (WRONGTYPE) gets its error while the models after it in the same call are counted."""
    from workers.quarantine import ATTEMPTS_PER_SCRIPT, Exhausted
    from workers.store.commit import LeaseLost

    r, keys = redis.Redis.from_url(settings.redis_url), Keys(settings.key_prefix)
    names = [f"m{i}" for i in range(ATTEMPTS_PER_SCRIPT + 5)]  # two script calls
    for m in names:
        r.set(keys.lease("default", m), "token")
    r.set(keys.lease("default", "m1"), "other")  # m1: the lease moved on
    r.hset(attempts_key(keys, "default", "m2"), mapping={"cursor": "1-0", "model": "fp", "attempts": 3})  # m2: spent
    r.set(attempts_key(keys, "default", "m3"), "not a hash")  # m3: its record raises
    attempts = Attempts(r, keys, "w")
    got = attempts.begin_many([("default", m, "token", b"1-0", "fp") for m in names], 3, "block")
    assert isinstance(got[1], LeaseLost) and isinstance(got[2], Exhausted)
    assert isinstance(got[3], redis.ResponseError) and "WRONGTYPE" in str(got[3])
    assert not r.exists(attempts_key(keys, "default", "m1"))
    assert r.get(attempts_key(keys, "default", "m3")) == b"not a hash"
    assert r.hget(attempts_key(keys, "default", "m2"), "attempts") == b"3"
    for i, m in enumerate(names):
        if i not in (1, 2, 3):
            number, attempt_id = got[i]
            assert number == 1 and r.hget(attempts_key(keys, "default", m), "id") == attempt_id.encode()
    again = attempts.begin_many([("default", "m0", "token", b"1-0", "fp")], 3, "block")
    assert again[0][0] == 2  # the same cursor: the second attempt
    r.close()
