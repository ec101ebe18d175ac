"""Leases outlive slow blocks (issue 11): the worker's heartbeat thread renews every held lease every
TTL/3 while a block runs, so a block many times longer than the lease TTL is absorbed once, and the
other models of the worker keep their leases."""

from __future__ import annotations

import math
import time

import pytest
import redis
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import api_with_models, linear_chunks, reference_trace, start_worker, strip
from workers.store.keys import Keys, counter_field
from workers.store.records import parse_share
from workers.worker.leases import COST_TIME_CONSTANT

LEASE_TTL = 0.5
# burn_in 6000 with 50 particles, moves after every annealing step (also for a block taken in one step): the
# longest block must outlast two 0.5 s leases on any machine this suite runs on; with burn_in 1500 the longest
# took 0.91 s on a quiet 2-core machine in session 6 (engine v2 got faster), so 4x that; "light" takes
# milliseconds per block
HEAVY = {
    "family": "linear_regression",
    "params": {"features": 2},
    "sampler": {"particles": 50, "burn_in": 6000, "block_size": 50, "moves": "every_step", "seed": 1},
}


@pytest.mark.slow
def test_blocks_longer_than_the_lease_are_absorbed_once(settings):
    models = {"heavy": HEAVY, "light": SMALL_MODEL}
    chunks = linear_chunks(2, 50, seed=2)
    with api_with_models(settings, models) as api:
        for c in chunks:
            assert api.post("/v1/streams/s/chunks", json=c).status_code == 202
        worker = start_worker(settings, LEASE_TTL)
        try:
            done = lambda: all(m["chunks_processed"] == 2 for m in api.get("/v1/streams/s").json()["models"])  # noqa: E731
            wait_until(done, timeout=300, interval=0.5)
        finally:
            worker.kill()
            worker.wait()
        traces = {name: api.get(f"/v1/models/{name}/trace").json()["items"] for name in models}
    # the case under test did happen, and the heartbeat is what made it commit: a block committed after
    # running > 2 TTLs held its lease throughout (the commit script's fence refuses a lapsed token)
    assert max(row["seconds"] for row in traces["heavy"]) > 2 * LEASE_TTL
    for name, model in models.items():
        assert strip(traces[name]) == strip(reference_trace(model, chunks)), name  # each block once, in order
    # No "zero lease losses" assertion: on a machine loaded by two CPU hogs beside the suite, the heartbeat
    # thread (due every TTL/3 = 0.17 s) once went unscheduled for > 0.33 s and a lease lapsed; the fence refused
    # that commit and the block was redone, still applied once (the traces above; the loss is counted in
    # keys.lease_losses, tested in test_a_lost_lease_is_counted_with_its_refused_blocks).


def test_a_lost_lease_is_counted_with_its_refused_blocks(settings):
    """A commit refused by the fence counts one lease loss and the chunk's blocks as retried; the
    next holder redoes them and the trace has each block once."""
    from workers.worker import Worker

    keys, r = Keys(settings.key_prefix), redis.Redis.from_url(settings.redis_url)
    model = {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "block_size": 100}}
    chunks = linear_chunks(2, 300, seed=3)
    with TestClient(create_app(settings, workers=0)) as api:
        assert api.post("/v1/models", json={"name": "m", "stream": "s", **model}).status_code == 201
        assert api.post("/v1/streams/s/chunks", json=chunks[0]).status_code == 202
        # no renewal between its passes in this test: the refusal comes from the commit's fence
        first = Worker(
            settings.model_copy(update={"lease_ttl_seconds": 60.0, "heartbeat_seconds": 60.0}), worker_id="first"
        )
        first.scan()
        while first.step():
            pass
        assert api.post("/v1/streams/s/chunks", json=chunks[1]).status_code == 202
        # taken over while the block runs (after the attempt's fenced start): the family's first
        # log-likelihood evaluation of this chunk hands the lease to someone else
        family = first.held["default/m"].engine.family
        original = family.stacked_log_likelihood

        def take_over(*args, **kwargs):
            if r.get(keys.lease("default", "m")) != b"someone-else":
                r.set(keys.lease("default", "m"), "someone-else")
            return original(*args, **kwargs)

        family.stacked_log_likelihood = take_over
        first.step()
        assert "default/m" not in first.held
        field = counter_field("first", "default", "m")
        assert r.hgetall(keys.lease_losses) == {field.encode(): b"1"}
        assert r.hgetall(keys.retried_blocks) == {field.encode(): b"3"}  # 300 values in blocks of 100
        r.delete(keys.lease("default", "m"))
        second = Worker(settings, worker_id="second")
        second.scan()
        while second.step():
            pass
        trace = api.get("/v1/models/m/trace").json()["items"]
        assert strip(trace) == strip(reference_trace(model, chunks))
        text = api.get("/metrics").text
        assert 'sgais_lease_losses_total{model="m",tenant="default",worker="first"} 1.0' in text
        assert 'sgais_retried_blocks_total{model="m",tenant="default",worker="first"} 3.0' in text
    r.close()


def test_a_worker_at_its_share_leases_a_new_model_once_a_held_one_is_deleted(settings):
    """A deleted model stops counting towards the worker's fair share at the next scan, not when the
    heartbeat's renewal finds its lease gone: with one live worker and one model, deleting it and creating
    another gets the new one leased by the next scan (the heartbeat is never due in this test)."""
    from workers.worker import Worker

    with TestClient(create_app(settings, workers=0)) as api:
        assert api.post("/v1/models", json={"name": "old", "stream": "s", **SMALL_MODEL}).status_code == 201
        worker = Worker(
            settings.model_copy(update={"lease_ttl_seconds": 60.0, "heartbeat_seconds": 60.0}), worker_id="w"
        )
        worker.heartbeat()  # counted live: the share is one model per live worker
        worker.scan()
        assert set(worker.held) == {"default/old"}
        assert api.delete("/v1/models/old").status_code == 204
        assert api.post("/v1/models", json={"name": "new", "stream": "s", **SMALL_MODEL}).status_code == 201
        worker.scan()
        assert "default/new" in worker.held
        worker.step()  # the loop drops the deleted model (no lease loss counted: it was deleted)
        assert set(worker.held) == {"default/new"}
        r = redis.Redis.from_url(settings.redis_url)
        assert not r.hget(Keys(settings.key_prefix).lease_losses, counter_field("w", "default", "old"))


def test_a_worker_is_live_from_begin_and_leases_nothing_before_it_runs(settings):
    """``Worker.begin()`` (what ``workers.runner`` calls before the warm-up imports) writes the heartbeat and starts
    the heartbeat thread: the API counts the worker live (``GET /readyz``) while it holds no model; a second call
    starts no second thread."""
    from workers.worker import Worker

    with TestClient(create_app(settings, workers=0)) as api:
        assert api.get("/readyz").status_code == 503
        assert api.post("/v1/models", json={"name": "m", "stream": "s", **SMALL_MODEL}).status_code == 201
        worker = Worker(settings, worker_id="early", warm=False)
        try:
            worker.begin()
            thread = worker._heartbeat
            worker.begin()
            assert worker._heartbeat is thread
            assert api.get("/readyz").status_code == 200
            assert worker.held == {}
            r = redis.Redis.from_url(settings.redis_url)
            assert r.get(Keys(settings.key_prefix).lease("default", "m")) is None
            r.close()
        finally:
            worker.stop.set()
            assert worker._heartbeat is not None
            worker._heartbeat.close()


def test_shares_follow_the_published_costs_not_the_count(settings, monkeypatch):
    """Two workers and six models, one of them ten times the others' measured cost: by count each worker would
    hold three (the costly one and two more on one side: 0.6 against 0.15 engine seconds per second); by cost
    one worker holds the costly model alone and the other the five cheap ones, and further scans move nothing."""
    from workers.worker import Worker, leases

    monkeypatch.setattr(leases, "MIN_HOLD_SECONDS", 0.0)  # a's models move as soon as b is live
    keys, r = Keys(settings.key_prefix), redis.Redis.from_url(settings.redis_url)
    names = ["big", "s1", "s2", "s3", "s4", "s5"]
    slow = settings.model_copy(update={"lease_ttl_seconds": 60.0, "heartbeat_seconds": 60.0})
    with TestClient(create_app(settings, workers=0)) as api:
        for name in names:
            assert api.post("/v1/models", json={"name": name, "stream": "s", **SMALL_MODEL}).status_code == 201
        r.hset(keys.costs, mapping={f"default/{n}": (0.5 if n == "big" else 0.05) for n in names})
        a, b = Worker(slow, worker_id="a"), Worker(slow, worker_id="b")
        t0 = time.monotonic()
        a.heartbeat()
        a.scan()
        assert set(a.held) == {f"default/{n}" for n in names}  # alone, it holds everything
        b.heartbeat()  # b is live, with no load published yet: it counts as 0
        for _ in range(3):
            a.scan()
            b.scan()
        holders = sorted([set(a.held), set(b.held)], key=len)
        assert holders == [{"default/big"}, {f"default/{n}" for n in names[1:]}]
        # the published costs, decayed as older measurements since their lease (time constant COST_TIME_CONSTANT)
        shares = sorted((parse_share(v) for v in r.hgetall(keys.loads).values()), key=lambda s: s[1])
        decay = math.exp(-(time.monotonic() - t0) / COST_TIME_CONSTANT)
        assert [n for _, n in shares] == [1, 5]
        (big, _), (small, _) = shares
        assert 0.5 * decay <= big <= 0.5 and 0.25 * decay <= small <= 0.25
        before = (set(a.held), set(b.held))
        checked = (a.leases.checked_at, b.leases.checked_at)
        a.scan()
        b.scan()
        assert (set(a.held), set(b.held)) == before
        # every model held by the published counts: no per-model lease check until a lease TTL (60 s) has passed
        assert (a.leases.checked_at, b.leases.checked_at) == checked
        a.shutdown()
        assert "a" not in {k.decode() for k in r.hkeys(keys.loads)}
        b.shutdown()
    r.close()
