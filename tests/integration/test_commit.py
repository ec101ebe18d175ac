"""The worker's fenced commit scripts (workers/store/commit.py) against a real Redis, driven step by step:
fencing, the stream posterior and its events, a model_switch alert, and an interrupted update."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import redis

from tests.conftest import SMALL_MODEL
from tests.integration.helpers import api_with_models, die, linear_chunks, reference_trace, run_until_idle, strip
from workers.engine import SINGLE_OBSERVATION_BLOCKS
from workers.store.commit import Scripts
from workers.store.keys import Keys
from workers.worker import LeaseLost, Worker

# "b" has 100x the prior weight but a noise std 5x too large: it leads at 0 observations, "a" after 300.
MODELS = {
    "a": {**SMALL_MODEL, "sampler": {**SMALL_MODEL["sampler"], "block_size": 300}},
    "b": {
        **SMALL_MODEL,
        "params": {"features": 2, "noise_std": 5.0},
        "sampler": {**SMALL_MODEL["sampler"], "block_size": 300, "seed": 4},
        "prior_probability": 100.0,
    },
}


@pytest.fixture
def api(settings):
    with api_with_models(settings, MODELS) as c:
        yield c


@pytest.fixture
def r(settings):
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.close()


def tenant_dump(r: redis.Redis, settings) -> dict[bytes, bytes]:
    """Every key of the tenant and the metrics hashes (not the worker heartbeat keys)."""
    keys = sorted(r.scan_iter(match=f"{settings.key_prefix}:default:*", count=1000))
    keys += [k.encode() for k in (Keys(settings.key_prefix).alerts_total, Keys(settings.key_prefix).block_seconds)]
    return {k: r.dump(k) for k in keys}


def test_commit_after_the_lease_was_lost_writes_nothing(api, settings, r):
    worker = Worker(settings)
    run_until_idle(worker)
    assert set(worker.held) == {"default/a", "default/b"}
    assert api.post("/v1/streams/s/chunks", json=linear_chunks(1, 300)[0]).status_code == 202
    r.set(Keys(settings.key_prefix).lease("default", "a"), "another-worker")  # the lease was taken over
    before = tenant_dump(r, settings)
    with pytest.raises(LeaseLost):
        worker.advance(worker.held["default/a"])
    assert tenant_dump(r, settings) == before


def _events_of_two_chunks(api, settings, r: redis.Redis) -> list[dict]:
    """Post two 300-row chunks to stream "s", run a worker until idle; the stream's events, in order."""
    for c in linear_chunks(2, 300, seed=8):
        assert api.post("/v1/streams/s/chunks", json=c).status_code == 202
    pubsub = r.pubsub()
    pubsub.subscribe(Keys(settings.key_prefix).events("default", "s"))
    pubsub.get_message(timeout=5)  # the subscription confirmation
    run_until_idle(Worker(settings))
    events = []
    while (msg := pubsub.get_message(timeout=1)) is not None:
        events.append(json.loads(msg["data"]))
    pubsub.close()
    return events


def test_stream_posterior_events_and_model_switch(api, settings, r):
    events = _events_of_two_chunks(api, settings, r)

    evidence = sorted(
        (e["model"], e["chunks_processed"], e["chunks_pending"]) for e in events if e["type"] == "evidence"
    )
    # one event per block: the stream's first SINGLE_OBSERVATION_BLOCKS values are blocks of their own
    singles = [(m, 0, 2) for m in "ab" for _ in range(SINGLE_OBSERVATION_BLOCKS)]
    assert evidence == sorted(singles + [("a", 1, 1), ("a", 2, 0), ("b", 1, 1), ("b", 2, 0)])
    posteriors = [e for e in events if e["type"] == "posterior"]
    assert [p["observations"] for p in posteriors] == [0, 300, 600]  # one event per move of the common count
    final = api.get("/v1/streams/s/posterior").json()
    assert {k: posteriors[-1][k] for k in final} == final
    switches = [e for e in events if e["type"] == "alert" and e["kind"] == "model_switch"]
    assert len(switches) == 1
    assert {k: switches[0][k] for k in ("stream", "model", "observation_index", "detected_at_index")} == {
        "stream": "s",
        "model": "a",
        "observation_index": 0,
        "detected_at_index": 299,
    }
    stored = api.get("/v1/alerts", params={"kind": "model_switch"}).json()["items"]
    assert [a["id"] for a in stored] == [switches[0]["id"]]
    leader = json.loads(r.get(Keys(settings.key_prefix).leader("default", "s")))
    assert leader == {"model": "a", "observations": 600}


def test_posterior_events_carry_each_models_current_status_and_reason(settings, r):
    """Model "d" keeps a reservoir of 100 rows (``history_capacity``): its first block of 300 makes it
    ``degraded`` (workers.stacking.RESERVOIR_REASON).  Every ``posterior`` event gives each model the status and
    reason that ``GET /v1/streams/{stream}/posterior`` gives at the same count: the worker once built the event
    from the stream state its commit script read before writing the committing model's checkpoint (a stale status)
    and without the degraded models' reasons."""
    sampler = {**SMALL_MODEL["sampler"], "block_size": 300}
    models = {
        "c": {**SMALL_MODEL, "sampler": sampler},
        "d": {**SMALL_MODEL, "sampler": {**sampler, "history_capacity": 100}},
    }
    with api_with_models(settings, models) as api:
        events = _events_of_two_chunks(api, settings, r)
        posteriors = [e for e in events if e["type"] == "posterior"]
        assert [p["observations"] for p in posteriors] == [0, 300, 600]
        reason = api.get("/v1/models/d/evidence").json()["error"]
        assert reason is not None and "reservoir" in reason
        for p in posteriors[1:]:  # each model has absorbed the block that degraded "d"
            got = {m["model"]: (m["status"], m["error"]) for m in p["models"]}
            assert got == {"c": ("ok", None), "d": ("degraded", reason)}, p["observations"]
        final = api.get("/v1/streams/s/posterior").json()
        assert {k: posteriors[-1][k] for k in final} == final


def test_next_holder_completes_an_interrupted_stream_posterior_update(api, settings, r, monkeypatch):
    chunks = linear_chunks(2, 300, seed=9)
    for c in chunks:
        assert api.post("/v1/streams/s/chunks", json=c).status_code == 202
    first = Worker(settings)
    # the worker dies after each commit, before its stream-posterior update
    monkeypatch.setattr(first, "update_stream_posterior", lambda *args, **kwargs: None)
    run_until_idle(first)
    leader_key = Keys(settings.key_prefix).leader("default", "s")
    assert r.get(leader_key) is None and api.get("/v1/models/b/evidence").json()["chunks_processed"] == 2
    die(first)
    run_until_idle(Worker(settings))  # restores the models from their checkpoints
    assert json.loads(r.get(leader_key)) == {"model": "a", "observations": 600}


def test_commit_script_stores_a_chunk_of_many_blocks(settings, r):
    # a chunk of 20,000 one-observation blocks (block_size 1) is 20,000 trace rows in one commit
    keys, n = Keys(settings.key_prefix), 20_000
    r.set(keys.lease("default", "m"), "token")
    rows = [
        {
            "seq": 1,
            "first_index": i,
            "block_observations": 1,
            "observations": i + 1,
            "log_predictive": -1.0,
            "log_evidence": -1.0 - i,
            "annealing_steps": 1,
            "ess": 10.0,
            "resampled": False,
            "guard_tripped": False,
            "seconds": 0.001,
        }
        for i in range(n)
    ]
    Scripts(r, keys).commit(
        tenant="default",
        model="m",
        stream="s",
        token="token",
        ttl_ms=1000,
        checkpoint={"chunks": 1, "observations": n},
        rows=rows,
        events=[],
        alerts=[],
        observations=n,
        known=None,
    )
    assert r.zcard(keys.trace("default", "m")) == n
    assert int(r.hget(keys.block_seconds, "count")) == n


def test_commits_sharing_a_script_call_succeed_or_fail_one_by_one(settings, r):
    """Scripts.commit_many runs several models' commits in one lua/commit.lua call: each is fenced by its own
    lease (a lost one writes nothing) and one that raises writes nothing while the others of the call apply."""
    from workers.store.commit import COMMITS_PER_SCRIPT

    keys = Keys(settings.key_prefix)
    names = [f"m{i}" for i in range(COMMITS_PER_SCRIPT + 3)]  # two script calls
    for m in names:
        r.set(keys.lease("default", m), "token")
    r.set(keys.lease("default", "m1"), "other")  # m1: the lease moved on
    r.set(keys.checkpoint("default", "m2"), "not a hash")  # m2: its checkpoint write raises (WRONGTYPE)
    row = {"seq": 1, "first_index": 0, "block_observations": 1, "observations": 1, "seconds": 0.001}
    calls = [
        {"tenant": "default", "model": m, "stream": "s", "token": "token", "ttl_ms": 1000,
         "checkpoint": {"chunks": 1, "observations": 1}, "rows": [row], "events": [], "alerts": [],
         "observations": 1, "known": None}
        for m in names
    ]  # fmt: skip
    replies = Scripts(r, keys).commit_many(calls)
    assert isinstance(replies[1], LeaseLost)
    assert isinstance(replies[2], redis.ResponseError) and "WRONGTYPE" in str(replies[2])
    assert r.get(keys.checkpoint("default", "m2")) == b"not a hash" and not r.exists(keys.trace("default", "m2"))
    assert not r.exists(keys.checkpoint("default", "m1"))
    for i, m in enumerate(names):
        if i not in (1, 2):
            assert replies[i] is None and r.hget(keys.checkpoint("default", m), "chunks") == b"1"
            assert r.zcard(keys.trace("default", m)) == 1
    assert int(r.hget(keys.block_seconds, "count")) == len(names) - 2


def _fresh_stream_round(settings, r, k: int) -> tuple[Keys, list[str], list[dict]]:
    """``k`` models registered on a fresh stream ``s`` (no leader record, every model at 0 values), each leased with
    token ``"token"``, and one commit call each of a first block of 5 values."""
    keys = Keys(settings.key_prefix)
    names = [f"m{i:02d}" for i in range(k)]
    for m in names:
        r.set(keys.lease("default", m), "token")
        r.set(keys.model("default", m), json.dumps({**SMALL_MODEL, "name": m, "stream": "s"}))
        r.sadd(keys.stream_models("default", "s"), m)
        r.zadd(keys.stream_obs("default", "s"), {m: 0})
    row = {"seq": 1, "first_index": 0, "block_observations": 5, "observations": 5, "seconds": 0.001}
    calls = [
        {"tenant": "default", "model": m, "stream": "s", "token": "token", "ttl_ms": 1000,
         "checkpoint": {"chunks": 1, "observations": 5, "status": "ok"}, "rows": [row], "events": [],
         "alerts": [], "observations": 5, "known": ""}
        for m in names
    ]  # fmt: skip
    return keys, names, calls


def test_a_fresh_streams_first_round_returns_its_state_once_per_count(settings, r):
    """A call of K commits on a stream with no leader record yet returns the stream's state once per common count
    it moves through (0 while a model has no values, then the count after the last commit), not once per commit:
    each returned state is an O(K) read of the stream (a fresh stream's first round of 1,000 models took ~10 s)."""
    from workers.store.commit import StreamState

    k = 12
    keys, names, calls = _fresh_stream_round(settings, r, k)
    replies = Scripts(r, keys).commit_many(calls)
    moved = {i: s for i, s in enumerate(replies) if isinstance(s, StreamState)}
    assert [(i, s.count) for i, s in moved.items()] == [(0, 0), (k - 1, 5)]
    assert all(reply is None for i, reply in enumerate(replies) if i not in moved)
    last = moved[k - 1]
    assert [(m, obs) for m, obs, *_ in last.models] == [(m, 5) for m in names]
    # every earlier model's row at 5 (the committing model's own rows are written after the script's reads)
    assert [json.loads(raw)["observations"] if raw else None for *_, raw, _ in last.models] == [5] * (k - 1) + [None]


def test_each_commit_reads_its_own_streams_known_models(settings, r):
    """The known-model lists travel once per script call (one per distinct list, the commits refer to theirs by
    number): commits of two streams interleaved in one call, with different lists, each get back the configs of the
    models their own list lacks, and only those."""
    from workers.store.commit import StreamState

    keys = Keys(settings.key_prefix)
    streams = {"s": ["s0", "s1", "s2"], "t": ["t0", "t1", "t2"]}
    known = {"s": "s0,s1", "t": ""}
    for stream, names in streams.items():
        for m in names:
            r.set(keys.lease("default", m), "token")
            r.set(keys.model("default", m), json.dumps({**SMALL_MODEL, "name": m, "stream": stream}))
            r.sadd(keys.stream_models("default", stream), m)
            r.zadd(keys.stream_obs("default", stream), {m: 0})
    row = {"seq": 1, "first_index": 0, "block_observations": 5, "observations": 5, "seconds": 0.001}
    calls = [
        {"tenant": "default", "model": m, "stream": stream, "token": "token", "ttl_ms": 1000,
         "checkpoint": {"chunks": 1, "observations": 5, "status": "ok"}, "rows": [row], "events": [],
         "alerts": [], "observations": 5, "known": known[stream]}
        for pair in zip(streams["s"], streams["t"], strict=True) for m, stream in zip(pair, "st", strict=True)
    ]  # fmt: skip
    replies = Scripts(r, keys).commit_many(calls)
    moved = [
        (call["stream"], reply) for call, reply in zip(calls, replies, strict=True) if isinstance(reply, StreamState)
    ]
    last = {stream: state for stream, state in moved if state.count == 5}
    assert sorted(last) == ["s", "t"]
    for stream, state in last.items():
        told = set(known[stream].split(",")) - {""}
        assert [(m, bool(cfg)) for m, _, _, _, cfg in state.models] == [(m, m not in told) for m in streams[stream]]


def test_a_state_lost_with_a_failed_commit_is_returned_by_the_next(settings, r):
    """A commit that read the stream's state and then raised returns no state: the next commit at that count
    returns it instead of taking it as already returned (else no stream posterior at that count until the next)."""
    from workers.store.commit import StreamState

    keys, names, calls = _fresh_stream_round(settings, r, 4)
    calls[0]["rows"] = [{**calls[0]["rows"][0], "seconds": math.nan}]  # its histogram's HINCRBYFLOAT raises
    replies = Scripts(r, keys).commit_many(calls)
    assert isinstance(replies[0], redis.ResponseError) and "float" in str(replies[0])
    # m00 stays at 0 values, so the count stays 0: the second commit returns the state at 0, the rest nothing
    assert isinstance(replies[1], StreamState) and replies[1].count == 0
    assert replies[2:] == [None, None]


def _shifted_chunks(n: int) -> list[dict]:
    """``n`` chunks of 5 values of N(0, 1), then N(4, 1) from value 20 on: a change the challengers confirm."""
    import torch

    g = torch.Generator().manual_seed(7)
    y = torch.randn(5 * n, generator=g, dtype=torch.float64)
    y[20:] += 4.0
    return [{"seq": i + 1, "y": y[5 * i : 5 * i + 5].tolist()} for i in range(n)]


GMM = {"family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"particles": 10, "burn_in": 3, "seed": 5}}


def test_a_restore_re_absorbs_the_chunks_committed_without_their_state(settings, r):
    """A backlog defers a model's state blob (``checkpoint_every``, Worker.commit_call): chunks are committed
    with everything but the particle state.  A worker that dies then leaves a checkpoint whose state is behind
    its cursor; the next holder re-absorbs those chunks from the stream log (restore.catch_up) and ends with the
    same state bits, trace and alerts as a worker that never stopped, the change point included."""
    chunks = _shifted_chunks(12)

    def run(stream: str, stop_after: int | None, **overrides) -> dict:
        # each run under its own prefix: the first run's dead worker and its model must not count in the
        # second run's fair share (a worker at its share of one leased the other run's model instead)
        s = settings.model_copy(update={"key_prefix": f"{settings.key_prefix}:{stream}", **overrides})
        keys = Keys(s.key_prefix)
        with api_with_models(s, {stream: GMM}, stream=stream) as c:
            for body in chunks:
                assert c.post(f"/v1/streams/{stream}/chunks", json=body).status_code == 202
            first = Worker(s)
            if stop_after is not None:  # the worker stops between rounds after `stop_after` chunks, as if killed
                committed = first.committed

                def counting(h, *args, **kw):
                    committed(h, *args, **kw)
                    if h.chunks >= stop_after:
                        first.stop.set()

                first.committed = counting  # type: ignore[method-assign]
            run_until_idle(first)
            ckpt = r.hgetall(keys.checkpoint("default", stream))
            die(first)  # nothing flushed
            second = Worker(s)
            run_until_idle(second)
            second.shutdown()
            final = r.hgetall(keys.checkpoint("default", stream))
            trace = c.get(f"/v1/models/{stream}/trace", params={"limit": 1000}).json()["items"]
            alerts = c.get("/v1/alerts", params={"model": stream}).json()["items"]
        return {"mid": ckpt, "final": final, "trace": trace, "alerts": alerts}

    deferred = run("a", stop_after=7, checkpoint_every=16, checkpoint_seconds=0.0)
    mid = deferred["mid"]
    assert int(mid[b"chunks"]) == 7 and mid[b"state_cursor"] != mid[b"cursor"]  # the state stayed behind
    reference = run("b", stop_after=None, checkpoint_every=1)
    assert reference["mid"][b"state_cursor"] == reference["mid"][b"cursor"]
    for field in (b"state", b"changepoint", b"chunks", b"observations", b"log_evidence", b"detector"):
        assert deferred["final"][field] == reference["final"][field], field
    assert strip(deferred["trace"]) == strip(reference["trace"])
    assert len(deferred["trace"]) == len({row["first_index"] for row in deferred["trace"]})  # none twice
    kinds = [(a["kind"], a["observation_index"]) for a in deferred["alerts"]]
    assert kinds == [(a["kind"], a["observation_index"]) for a in reference["alerts"]]
    assert ("change_point", 20) in kinds  # the change was confirmed, once, in the re-absorbed or later chunks


def _engine_bytes(worker: Worker, name: str) -> tuple[bytes, bytes]:
    """The engine state and challengers of the model ``name`` the worker holds (:meth:`SegmentedEngine.to_bytes`)."""
    (h,) = [h for h in worker.leases.snapshot() if h.name == name]
    return h.engine.to_bytes(include_history=False), h.engine.changepoint_bytes()


def test_a_live_feed_stores_its_state_every_few_chunks_and_the_posterior_after_each(settings, r):
    """A live feed (each chunk absorbed before the next arrives) stores the particle state only every
    ``checkpoint_every`` chunks while the engine seconds since it stay below ``checkpoint_seconds``
    (Worker.state_due); every other chunk stores the posterior's particles (``view``), so the posterior and
    predictive routes answer for the last committed chunk, as with a state stored every chunk.  A worker that dies
    then is succeeded by one that re-absorbs both models' chunks since their states in its stacked rounds (not
    committed again) and ends with the same bits, then goes on with the next chunk."""
    chunks = _shifted_chunks(11)
    other = {**GMM, "sampler": {**GMM["sampler"], "seed": 6}}

    def run(stream: str, **overrides) -> dict:
        s = settings.model_copy(update={"key_prefix": f"{settings.key_prefix}:{stream}", **overrides})
        keys = Keys(s.key_prefix)
        names = [stream, f"{stream}-b"]
        out: dict = {"posteriors": [], "predictives": [], "deferred": 0}
        with api_with_models(s, {names[0]: GMM, names[1]: other}, stream=stream) as c:
            first = Worker(s)
            for i, body in enumerate(chunks[:10]):
                assert c.post(f"/v1/streams/{stream}/chunks", json=body).status_code == 202
                run_until_idle(first)
                for name in names:
                    ckpt = r.hgetall(keys.checkpoint("default", name))
                    assert int(ckpt[b"chunks"]) == i + 1
                    out["deferred"] += ckpt[b"state_cursor"] != ckpt[b"cursor"]
                    out["posteriors"].append(c.get(f"/v1/models/{name}/posterior").json())
                    pred = c.get(f"/v1/models/{name}/predictive").json()
                    out["predictives"].append({k: v for k, v in pred.items() if k not in ("model", "stream")})
            before = [_engine_bytes(first, name) for name in names]
            die(first)  # nothing flushed
            second = Worker(s)
            run_until_idle(second)  # restores, then re-absorbs the chunks since the stored states, stacked
            assert [_engine_bytes(second, name) for name in names] == before
            assert c.post(f"/v1/streams/{stream}/chunks", json=chunks[10]).status_code == 202
            run_until_idle(second)
            for name in names:
                trace = c.get(f"/v1/models/{name}/trace", params={"limit": 1000}).json()["items"]
                assert trace[-1]["seq"] == 11 and len(trace) == len({row["first_index"] for row in trace})
                out.setdefault("traces", []).append(strip(trace))
            second.shutdown()
        return out

    live = run("live", checkpoint_every=4, checkpoint_seconds=1e9)
    every = run("every", checkpoint_every=1)
    assert live["deferred"] == 16 and every["deferred"] == 0  # chunks 4 and 8 of 10 stored them
    assert all(a != b for a, b in zip(live["posteriors"][::2], live["posteriors"][2::2], strict=False))  # none stale
    assert live["posteriors"] == every["posteriors"]
    assert live["predictives"] == every["predictives"]
    assert live["traces"] == every["traces"]


def test_the_stream_observation_set_follows_commits_errors_and_deletes(api, settings, r):
    """``P:T:stream:s:obs`` (model -> committed observations, +inf in error) is what a commit reads instead of
    every model's checkpoint when nothing moved (lua/commit.lua): it must follow every commit, error and delete,
    or the stream posterior would stop at a stale count."""
    k = Keys(settings.key_prefix)
    obs_key = k.stream_obs("default", "s")
    assert r.zrange(obs_key, 0, -1, withscores=True) == [(b"a", 0.0), (b"b", 0.0)]  # created
    for c in linear_chunks(2, 300, seed=8):
        assert api.post("/v1/streams/s/chunks", json=c).status_code == 202
    worker = Worker(settings)
    run_until_idle(worker)
    assert r.zrange(obs_key, 0, -1, withscores=True) == [(b"a", 600.0), (b"b", 600.0)]
    worker.record_error(worker.held["default/b"], RuntimeError("poisoned"))
    assert r.zscore(obs_key, "b") == float("inf")
    for c in linear_chunks(3, 300, seed=9)[2:]:
        assert api.post("/v1/streams/s/chunks", json={**c, "seq": 3}).status_code == 202
    run_until_idle(worker)
    # b is out of the common count: a's commit moved it to 900 (the posterior follows a alone)
    assert json.loads(r.get(k.leader("default", "s")))["observations"] == 900
    assert api.get("/v1/streams/s/posterior").json()["observations"] == 900
    assert api.delete("/v1/models/b").status_code == 204
    assert r.zrange(obs_key, 0, -1, withscores=True) == [(b"a", 900.0)]
    assert api.delete("/v1/streams/s").status_code == 204
    assert not r.exists(obs_key)


def test_a_rounds_commits_are_read_after_the_next_rounds_blocks(settings, r, monkeypatch):
    """Worker.absorb_round sends a round's commits and reads their replies only after the next round's blocks
    (Redis runs them meanwhile).  A model whose commit of round 0 does not land (its lease moved on while the
    script was on its way) is dropped when that is read: the chunk it absorbed in round 1 meanwhile is never
    committed, its checkpoint and trace stay as they were, and the worker holds it no longer.  The other model
    commits its three chunks exactly once, with the trace an uninterrupted engine gives."""
    import workers.worker.loop as loop
    from workers.store.commit import Scripts as CommitScripts

    keys = Keys(settings.key_prefix)
    chunks = linear_chunks(3, 40, seed=5)
    with api_with_models(settings, {"a": SMALL_MODEL, "b": SMALL_MODEL}) as c:
        worker = Worker(settings)
        run_until_idle(worker)  # leased, initial checkpoints committed
        for body in chunks:  # all three read in one batch: three rounds
            assert c.post("/v1/streams/s/chunks", json=body).status_code == 202
        before = r.hgetall(keys.checkpoint("default", "a"))
        send, order = CommitScripts.send_commits, []

        def sending(self, calls, *args):
            order.append([call["model"] for call in calls])
            if len(order) == 1:  # round 0: a's lease moves on before its commit runs
                r.set(keys.lease("default", "a"), "another-worker")
            return send(self, calls, *args)

        engine_a = worker.held["default/a"].engine
        absorbed, blocks = [], loop.advance_blocks

        def advancing(engines, *args, **kw):  # after which send a's engine absorbs a block
            if engine_a in engines:
                absorbed.append(len(order))
            return blocks(engines, *args, **kw)

        monkeypatch.setattr(CommitScripts, "send_commits", sending)
        monkeypatch.setattr(loop, "advance_blocks", advancing)
        run_until_idle(worker)
        assert [sorted(models) for models in order] == [["a", "b"], ["b"], ["b"]]
        assert absorbed[-1] == 1  # a absorbed its round-1 chunk after its round-0 commit went out, then dropped it
        assert r.hgetall(keys.checkpoint("default", "a")) == before
        assert r.zcard(keys.trace("default", "a")) == 0
        assert "default/a" not in worker.held
        assert int(r.hget(keys.checkpoint("default", "b"), "chunks")) == 3
        trace = c.get("/v1/models/b/trace", params={"limit": 1000}).json()["items"]
    assert strip(trace) == strip(reference_trace(SMALL_MODEL, chunks))


def test_commits_sent_to_a_redis_without_the_script_run_once_it_is_loaded(settings, r):
    """Commits are written as EVALSHA without waiting (workers.store.scripts.Sent); a Redis whose script cache lost
    the commit script (restarted, or SCRIPT FLUSH) answers NOSCRIPT and runs nothing: the commits then run once, in
    order, after the script is loaded."""
    keys = Keys(settings.key_prefix)
    scripts = Scripts(r, keys)
    row = {"seq": 1, "first_index": 0, "block_observations": 1, "observations": 1, "seconds": 0.001}
    calls = []
    for m in ("m0", "m1"):
        r.set(keys.lease("default", m), "token")
        calls.append({"tenant": "default", "model": m, "stream": "s", "token": "token", "ttl_ms": 1000,
                      "checkpoint": {"chunks": 1, "observations": 1}, "rows": [row], "events": [], "alerts": [],
                      "observations": 1, "known": None})  # fmt: skip
    r.script_flush()
    assert not r.script_exists(scripts._commit.sha)[0]
    assert scripts.commit_many(calls) == [None, None]
    for m in ("m0", "m1"):
        assert r.hget(keys.checkpoint("default", m), "chunks") == b"1" and r.zcard(keys.trace("default", m)) == 1
    assert int(r.hget(keys.block_seconds, "count")) == 2


def test_a_rounds_commits_are_written_as_they_are_staged(settings, r, monkeypatch):
    """Worker.send_round writes every COMMITS_PER_SCRIPT staged commits at once, on one connection, so Redis runs
    them while the worker stages the next: with two per write and three models, the first two commits go out before
    the third is formed, and all three land once."""
    import workers.worker.loop as loop
    from workers.store.commit import Scripts as CommitScripts

    monkeypatch.setattr(loop, "COMMITS_PER_SCRIPT", 2)
    keys = Keys(settings.key_prefix)
    with api_with_models(settings, {m: SMALL_MODEL for m in ("a", "b", "c")}) as c:
        worker = Worker(settings)
        run_until_idle(worker)
        assert c.post("/v1/streams/s/chunks", json=linear_chunks(1, 40, seed=6)[0]).status_code == 202
        events: list[tuple[str, Any]] = []
        send, call = CommitScripts.send_commits, Worker.commit_call

        def sending(self, calls, *args):
            events.append(("send", sorted(x["model"] for x in calls)))
            return send(self, calls, *args)

        def forming(self, h, *args, **kw):
            events.append(("form", h.name))
            return call(self, h, *args, **kw)

        monkeypatch.setattr(CommitScripts, "send_commits", sending)
        monkeypatch.setattr(Worker, "commit_call", forming)
        run_until_idle(worker)
        assert [kind for kind, _ in events] == ["form", "form", "send", "form", "send"]
        assert sorted(sum((v for kind, v in events if kind == "send"), [])) == ["a", "b", "c"]
        for m in ("a", "b", "c"):
            assert r.hget(keys.checkpoint("default", m), "chunks") == b"1" and r.zcard(keys.trace("default", m)) > 0
