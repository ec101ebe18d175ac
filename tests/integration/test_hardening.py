"""Issue 11 (API side), in process against a real Redis: strict bodies, admission control, quotas, the
log-likelihood screen at ingestion, DELETE /v1/streams/{stream}, WebSocket binary frames and gaps."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
import torch
from fastapi.testclient import TestClient

from service.app import create_app
from service.events_hub import EventHub, Subscriber
from tests.conftest import SMALL_MODEL
from workers import admission, screening
from workers.settings import SamplerSettings

HUGE = "1" + "0" * 400  # an integer literal beyond the float range
J = {"content-type": "application/json"}

STREAMS = {  # stream -> (model body, a good chunk)
    "s": ({"name": "a", "stream": "s", **SMALL_MODEL}, {"x": [[0.5, 1.0]], "y": [1.0]}),
    "g": ({"name": "g1", "stream": "g", "family": "gmm", "params": {"dim": 1, "components": 2}}, {"y": [0.3]}),
    "v": ({"name": "v1", "stream": "v", "family": "gmm", "params": {"dim": 2, "components": 1}}, {"y": [[0.3, 1]]}),
    "ar": ({"name": "ar1", "stream": "ar", "family": "autoregressive", "params": {"order": 2}}, {"y": [0.1, 0.2]}),
    "c": (
        {"name": "clf", "stream": "c", "family": "logistic_regression", "params": {"features": 2, "classes": 3}},
        {"x": [[1, 2]], "y": [1]},
    ),
}

# (id, path, raw body, headers, status, text the detail must contain)
CASES = [
    (
        "text-plain-chunk",
        "/v1/streams/s/chunks",
        '{"x": [[1, 2]], "y": [1]}',
        {"content-type": "text/plain"},
        415,
        "json",
    ),
    ("no-content-type", "/v1/streams/s/chunks", '{"x": [[1, 2]], "y": [1]}', {}, 415, "json"),
    (
        "text-plain-model",
        "/v1/models",
        json.dumps({"name": "m2", **SMALL_MODEL}),
        {"content-type": "text/plain"},
        415,
        "",
    ),
    ("non-utf8-chunk", "/v1/streams/s/chunks", b'{"y":[1.0], "\xff": 1}', J, 400, "utf-8"),
    ("utf16-chunk", "/v1/streams/s/chunks", '{"x": [[1, 2]], "y": [1]}'.encode("utf-16"), J, 400, "utf-8"),
    ("non-utf8-model", "/v1/models", b'{"name": "\xfe\xff", "family": "gmm"}', J, 400, "utf-8"),
    ("nan-model-body", "/v1/models", "NaN", J, 422, "nan"),
    (
        "infinity-prior",
        "/v1/models",
        '{"name": "q", "family": "gmm", "prior_probability": Infinity}',
        J,
        422,
        "infinity",
    ),
    (
        "nan-in-params",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": 1, "components": 1, "variance_scale": NaN}}',
        J,
        422,
        "nan",
    ),
    (
        "infinity-alert",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": 1, "components": 1}, '
        '"alerts": {"drop_threshold": -Infinity}}',
        J,
        422,
        "infinity",
    ),
    (
        "huge-int-param",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": 1, "components": 1, "variance_scale": ' + HUGE + "}}",
        J,
        422,
        "float range",
    ),
    (
        "dim-string",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": "2", "components": 1}}',
        J,
        422,
        "dim",
    ),
    (
        "dim-bool",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": true, "components": 1}}',
        J,
        422,
        "dim",
    ),
    (
        "particles-string",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"particles": "20"}}',
        J,
        422,
        "particles",
    ),
    (
        "deep-nesting",
        "/v1/models",
        '{"name": "q", "family": "gmm", "params": ' + "[" * 100000 + "]" * 100000 + "}",
        J,
        422,
        "json",
    ),
    ("invalid-json-model", "/v1/models", '{"name": "q",', J, 422, "json"),
    ("huge-int-y-linreg", "/v1/streams/s/chunks", '{"x": [[1, 2], [1, 2]], "y": [1, ' + HUGE + "]}", J, 422, "y[1]"),
    ("huge-int-x-linreg", "/v1/streams/s/chunks", '{"x": [[1, 2], [1, ' + HUGE + ']], "y": [1, 2]}', J, 422, "x[1]"),
    ("huge-int-gmm", "/v1/streams/g/chunks", '{"y": [' + HUGE + "]}", J, 422, "y[0]"),
    ("huge-int-gmm-vector", "/v1/streams/v/chunks", '{"y": [[1, 2], [1, ' + HUGE + "]]}", J, 422, "y[1]"),
    ("huge-int-ar", "/v1/streams/ar/chunks", '{"y": [1, 2, -' + HUGE + "]}", J, 422, "y[2]"),
    ("huge-int-logistic-x", "/v1/streams/c/chunks", '{"x": [[' + HUGE + ', 1]], "y": [1]}', J, 422, "x[0]"),
    ("extra-key-nan", "/v1/streams/s/chunks", '{"x": [[1, 2]], "y": [1], "z": NaN}', J, 422, "z"),
    ("poison-1e308-gmm", "/v1/streams/g/chunks", '{"y": [0.1, 1e308, -1e308]}', J, 422, "y[1]"),
    ("poison-1e200-vector", "/v1/streams/v/chunks", '{"y": [[0.1, 0.2], [0.3, 1e200]]}', J, 422, "y[1]"),
    ("poison-1e155-ar", "/v1/streams/ar/chunks", '{"y": [0.1, 0.2, 0.3, 1e155]}', J, 422, "y[3]"),
    ("poison-x-linreg", "/v1/streams/s/chunks", '{"x": [[1, 2], [1e300, 1e300]], "y": [1, 2]}', J, 422, "[1]"),
    (
        "admission-cuda",
        "/v1/models",
        json.dumps(
            {"name": "q", "family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"device": "cuda"}}
        ),
        J,
        422,
        "device",
    ),
    (
        "admission-huge-gmm",
        "/v1/models",
        json.dumps({"name": "q", "family": "gmm", "params": {"dim": 1000, "components": 1000}}),
        J,
        422,
        '"params"',
    ),
    (
        "admission-huge-logistic",
        "/v1/models",
        json.dumps({"name": "q", "family": "logistic_regression", "params": {"features": 10000, "classes": 10000}}),
        J,
        422,
        '"params"',
    ),
    (
        "admission-huge-bnn",
        "/v1/models",
        json.dumps({"name": "q", "family": "bnn", "params": {"features": 10, "hidden": [100000] * 16}}),
        J,
        422,
        '"params"',
    ),
    (
        "admission-history",
        "/v1/models",
        json.dumps(
            {
                "name": "q",
                "family": "gmm",
                "params": {"dim": 1, "components": 1},
                "sampler": {"history_capacity": 10**12},
            }
        ),
        J,
        422,
        "history_capacity",
    ),
    (
        "admission-particles",
        "/v1/models",
        json.dumps(
            {
                "name": "q",
                "family": "gmm",
                "params": {"dim": 10, "components": 10},
                "sampler": {"particles": 100000, "warmup_particles": 1000000},
            }
        ),
        J,
        422,
        "particles",
    ),
    (
        "admission-burn-in",
        "/v1/models",
        json.dumps(
            {
                "name": "q",
                "family": "gmm",
                "params": {"dim": 1, "components": 1},
                "sampler": {"burn_in": 10000, "particles": 1000, "warmup_particles": 1000},
            }
        ),
        J,
        422,
        "burn_in",
    ),
]


def dump(r: redis.Redis, prefix: str) -> dict[bytes, bytes]:
    return {k: r.dump(k) for k in sorted(r.scan_iter(match=f"{prefix}:*", count=1000))}


@pytest.fixture
def hardened(settings):
    """An app (no workers) with one model on each stream of STREAMS and one chunk each."""
    with TestClient(create_app(settings, workers=0)) as c:
        for model, chunk in STREAMS.values():
            assert c.post("/v1/models", json=model).status_code == 201
            assert c.post(f"/v1/streams/{model['stream']}/chunks", json=chunk).status_code == 202
        yield c


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_is_4xx_without_trace(hardened, settings, case):
    name, path, body, headers, status, needle = case
    if name == "admission-cuda" and torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    r = redis.Redis.from_url(settings.redis_url)
    before = dump(r, settings.key_prefix)
    res = hardened.post(path, content=body, headers=headers)
    assert res.status_code == status, res.text
    assert needle.lower() in json.dumps(res.json()["detail"]).lower(), res.text
    assert dump(r, settings.key_prefix) == before


def test_poisoned_chunk_names_the_row_and_the_model(hardened):
    res = hardened.post("/v1/streams/g/chunks", json={"y": [0.1, 0.2, 1e308]})
    (err,) = res.json()["detail"]
    assert err["loc"] == ["body", "y", 2] and "g1" in err["msg"] and "log-likelihood" in err["msg"]
    # the screen uses every model of the stream: a second family on the same stream is consulted too
    assert (
        hardened.post(
            "/v1/models", json={"name": "g2", "stream": "g", "family": "autoregressive", "params": {"order": 1}}
        ).status_code
        == 201
    )
    assert hardened.post("/v1/streams/g/chunks", json={"y": [0.5, -1.5, 3.0]}).status_code == 202


def test_body_over_limit_is_413_while_reading(settings):
    """No Content-Length (chunked upload): the body is counted while it is read."""
    s = settings.model_copy(update={"max_body_bytes": 4096})
    with TestClient(create_app(s, workers=0)) as c:
        assert c.post("/v1/models", json={"name": "a", "stream": "s", **SMALL_MODEL}).status_code == 201

        def parts():
            yield b'{"x": [[1, 2]], "y": [1'
            for _ in range(1000):
                yield b", 1.0"
            yield b"]}"

        res = c.post("/v1/streams/s/chunks", content=parts(), headers=J)
        assert res.status_code == 413
        assert c.get("/v1/streams/s").json()["chunks"] == 0


def test_admission_accepts_the_thesis_models(settings):
    """The thesis' gmm (3 and 7 components, 2-D), regression and a small bnn are admitted with defaults."""
    with TestClient(create_app(settings, workers=0)) as c:
        bodies = [
            {"name": "g3", "stream": "g", "family": "gmm", "params": {"dim": 2, "components": 3}},
            {
                "name": "g7",
                "stream": "g",
                "family": "gmm",
                "params": {"dim": 2, "components": 7},
                "sampler": {"particles": 100, "warmup_particles": 200},
            },
            {"name": "lr", "family": "logistic_regression", "params": {"features": 20, "classes": 4}},
            {"name": "nn", "family": "bnn", "params": {"features": 5, "hidden": [16], "outputs": 1}},
        ]
        for body in bodies:
            assert c.post("/v1/models", json=body).status_code == 201, body


def test_admission_estimate_scales_with_the_sizes(settings):
    from models import make_family

    small = admission.estimate(make_family("gmm", {"dim": 2, "components": 3}), SamplerSettings(), 1e9)
    big = admission.estimate(make_family("gmm", {"dim": 20, "components": 30}), SamplerSettings(), 1e9)
    # D and the [M, B, K, d] intermediates both grow 100x (K·d: 6 -> 600)
    assert 50 < big.memory_bytes / small.memory_bytes < 150
    assert 50 < big.block_seconds / small.block_seconds < 150


def test_quotas_are_429(settings):
    s = settings.model_copy(update={"max_models_per_tenant": 2, "max_pending_observations_per_tenant": 5})
    r = redis.Redis.from_url(s.redis_url)
    with TestClient(create_app(s, workers=0)) as c:
        for name in ("a", "b"):
            assert c.post("/v1/models", json={"name": name, "stream": "s", **SMALL_MODEL}).status_code == 201
        res = c.post("/v1/models", json={"name": "c", "stream": "s", **SMALL_MODEL})
        assert res.status_code == 429 and "quota" in res.json()["detail"] and res.headers["retry-after"]
        # two models on the stream: 2 observations are 4 pending, 3 more would be 10 > 5
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]] * 2, "y": [1, 2]}).status_code == 202
        before = dump(r, s.key_prefix)
        res = c.post("/v1/streams/s/chunks", json={"x": [[1, 2]] * 3, "y": [1, 2, 3]})
        assert res.status_code == 429 and "pending" in res.json()["detail"]
        assert dump(r, s.key_prefix) == before
        # an errored model absorbs nothing: its backlog does not count (written as the worker writes an error:
        # workers.quarantine, Worker.record_error: its status, and +inf in the stream's observation counts)
        r.hset(f"{s.key_prefix}:default:ckpt:b", mapping={"status": "error", "observations": 0})
        r.zadd(f"{s.key_prefix}:default:stream:s:obs", {"b": "+inf"})
        r.hset(f"{s.key_prefix}:default:ckpt:a", mapping={"status": "ok", "observations": 2})
        import service.quotas

        service.quotas._cache.clear()
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]] * 3, "y": [1, 2, 3]}).status_code == 202


def test_delete_stream(settings):
    s = settings.model_copy(update={"api_keys": "alpha=ka,beta=kb"})
    r = redis.Redis.from_url(s.redis_url)
    A, B = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    with TestClient(create_app(s, workers=0)) as c:
        for h in (A, B):
            for name in ("m1", "m2"):
                assert (
                    c.post("/v1/models", json={"name": name, "stream": "s", **SMALL_MODEL}, headers=h).status_code
                    == 201
                )
            assert (
                c.post("/v1/models", json={"name": "other", "stream": "t", **SMALL_MODEL}, headers=h).status_code == 201
            )
            assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]], "y": [1]}, headers=h).status_code == 202
        p = s.key_prefix
        for m in ("m1", "m2"):  # what a worker would have written
            r.hset(f"{p}:alpha:ckpt:{m}", mapping={"observations": 1, "status": "ok"})
            r.zadd(f"{p}:alpha:trace:{m}", {json.dumps({"first_index": 0}): 0})
            r.set(f"{p}:alpha:lease:{m}", "token")
        alerts = [{"id": str(i), "stream": st, "model": m} for i, (st, m) in enumerate([("s", "m1"), ("t", "other")])]
        r.zadd(f"{p}:alpha:alerts", {json.dumps(a): i for i, a in enumerate(alerts)})
        beta_before = {k: r.dump(k) for k in r.scan_iter(match=f"{p}:beta:*")}

        assert c.delete("/v1/streams/s", headers=A).status_code == 204
        left = sorted(k.decode() for k in r.scan_iter(match=f"{p}:alpha:*"))
        assert left == [
            f"{p}:alpha:alerts",
            f"{p}:alpha:model:other",
            f"{p}:alpha:models",
            f"{p}:alpha:stream:t:meta",
            f"{p}:alpha:stream:t:models",
            f"{p}:alpha:stream:t:obs",
        ]
        assert [json.loads(a)["stream"] for a in r.zrange(f"{p}:alpha:alerts", 0, -1)] == ["t"]
        assert sorted(r.smembers(f"{p}:models")) == [b"alpha/other", b"beta/m1", b"beta/m2", b"beta/other"]
        assert {k: r.dump(k) for k in r.scan_iter(match=f"{p}:beta:*")} == beta_before  # tenant-scoped
        assert c.delete("/v1/streams/s", headers=A).status_code == 404
        assert c.get("/v1/models/m1", headers=A).status_code == 404
        assert c.get("/v1/models/m1", headers=B).status_code == 200
        assert c.delete("/v1/streams/nope", headers=B).status_code == 404
        # the name can be used again, from scratch
        assert c.post("/v1/models", json={"name": "m1", "stream": "s", **SMALL_MODEL}, headers=A).status_code == 201
        assert c.get("/v1/streams/s", headers=A).json()["chunks"] == 0


def test_websocket_binary_frame_is_an_error_not_a_drop(hardened):
    with hardened.websocket_connect("/v1/streams/s/events") as ws:
        ws.send_bytes(b"\x00\x01")
        msg = ws.receive_json()
        assert msg["type"] == "error" and msg["status"] == 400 and "binary" in msg["detail"]
        ws.send_text('{"type": "chunk", "x": [[1, 2]], "y": [' + HUGE + "]}")
        msg = ws.receive_json()
        assert msg["type"] == "error" and msg["status"] == 422 and "y" in json.dumps(msg["detail"])
        ws.send_json({"type": "chunk", "x": [[1, 2]], "y": [1.5]})
        msg = ws.receive_json()
        assert msg["type"] == "ack" and msg["seq"] == 2


def _evidence(model: str, first: int, n: int = 10) -> str:
    return json.dumps(
        {"type": "evidence", "model": model, "observations": first + n, "last_block": {"first_index": first}}
    )


def test_subscriber_overflow_becomes_gaps():
    async def run():
        sub = Subscriber(3)
        for i in range(3):
            sub.offer(_evidence("a", 10 * i), "a", 10 * i)
        sub.offer(_evidence("b", 0), "b", 0)  # overflow: the three queued and this one become gaps
        sub.offer(_evidence("a", 30), "a", 30)  # queued after the gap
        gaps = await sub.next_texts()
        assert sorted(gaps) == sorted(
            [
                json.dumps({"type": "gap", "model": "a", "since_index": 0}),
                json.dumps({"type": "gap", "model": "b", "since_index": 0}),
            ]
        )
        assert json.loads((await sub.next_texts())[0])["last_block"]["first_index"] == 30
        assert sub.queue.empty() and sub.dropped == 4

    asyncio.run(run())


def test_hub_shares_one_subscription(settings):
    """Many sockets, one pub/sub connection; a full queue does not hold back the others."""

    async def run():
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
        hub = EventHub(r)
        channel = f"{settings.key_prefix}:default:events:s"
        slow, fast = Subscriber(2), [Subscriber(100) for _ in range(50)]
        for sub in [slow, *fast]:
            await hub.subscribe(channel, sub)
        for i in range(20):
            await r.publish(channel, _evidence("m", 10 * i))
        for sub in fast:
            got = [json.loads(t) for _ in range(20) for t in await asyncio.wait_for(sub.next_texts(), 30)]
            assert [e["last_block"]["first_index"] for e in got] == [10 * i for i in range(20)]
        texts = []
        while not slow.queue.empty():
            texts += await slow.next_texts()
        kinds = [json.loads(t)["type"] for t in texts]
        assert "gap" in kinds and json.loads(texts[kinds.index("gap")])["since_index"] == 0
        # one Redis subscriber on the channel for the 51 sockets (PUBSUB NUMSUB counts this channel only, so other
        # clients of a shared Redis server do not count; the client list did, and failed on a busy machine)
        assert [n for _, n in await r.pubsub_numsub(channel)] == [1]
        for sub in [slow, *fast]:
            await hub.unsubscribe(channel, sub)
        await hub.close()
        await r.aclose()

    asyncio.run(run())


def test_hub_reader_waits_for_a_socket_without_polling(settings, monkeypatch):
    """With no socket following any channel the hub's reader waits for the next subscription instead of sleeping
    in a loop: a fixed sleep there held a new socket's first events back by up to its length (0.5 s: a lone model's
    20 chunks measured 14 ms per block end to end instead of 5-11, bench/many_models.py) and then sent them in one
    burst.  Checked without a clock: the reader makes no sleep call while idle, and the new socket gets its event."""
    import service.events_hub as events_hub

    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def spy(delay: float, *args):
        sleeps.append(delay)
        return await real_sleep(delay, *args)

    async def run():
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
        hub = EventHub(r)
        first, second = f"{settings.key_prefix}:default:events:a", f"{settings.key_prefix}:default:events:b"
        sub = Subscriber(10)
        await hub.subscribe(first, sub)
        await r.publish(first, _evidence("m", 0))
        assert json.loads((await asyncio.wait_for(sub.next_texts(), 30))[0])["last_block"]["first_index"] == 0
        monkeypatch.setattr(events_hub.asyncio, "sleep", spy)
        await hub.unsubscribe(first, sub)  # no socket follows anything now: the reader goes idle
        # until the reader is idle (it clears `followed` there) or sleeps (the fixed sleep this test guards against);
        # it first waits out get_message's 1 s timeout, however long that takes on a busy machine
        for _ in range(600):
            if not hub.followed.is_set() or [d for d in sleeps if d > 0]:
                break
            await real_sleep(0.05)
        assert [d for d in sleeps if d > 0] == [] and not hub.followed.is_set()  # idle, waiting without a sleep
        later = Subscriber(10)
        await hub.subscribe(second, later)
        await r.publish(second, _evidence("m", 5))
        got = await asyncio.wait_for(later.next_texts(), 30)
        assert json.loads(got[0])["last_block"]["first_index"] == 5
        assert [d for d in sleeps if d > 0] == []  # the idle reader never slept (before: asyncio.sleep(0.5) calls)
        await hub.unsubscribe(second, later)
        await hub.close()
        await r.aclose()

    asyncio.run(run())


def test_screening_is_deterministic_and_passes_ordinary_data():
    cfg = {"name": "g", "family": "gmm", "params": {"dim": 1, "components": 3}, "sampler": {}}
    g = torch.Generator().manual_seed(0)
    y = (torch.randn(2000, 1, generator=g, dtype=torch.float64) * 1e3).tolist()
    fam_x, fam_y = None, torch.tensor(y, dtype=torch.float64)
    assert screening.first_nonfinite_row(cfg, fam_x, fam_y) is None
    fam_y[1234, 0] = 1e160
    assert screening.first_nonfinite_row(cfg, fam_x, fam_y)[0] == 1234
    f32 = {**cfg, "sampler": {"dtype": "float32"}}
    small = torch.tensor([[0.5], [1e30]], dtype=torch.float64)  # (1e30)² overflows float32 only
    assert screening.first_nonfinite_row(cfg, None, small) is None
    assert screening.first_nonfinite_row(f32, None, small)[0] == 1


def test_a_streams_models_screened_together_answer_as_each_alone():
    """The stacked screen (one evaluation per stack key and dtype) refuses the same first row, for the same model,
    as screening each model alone; models of other stack keys and dtypes in the same call."""
    configs = [
        {"name": f"g{i}", "family": "gmm", "params": {"dim": 1, "components": 1, "mean_scale": 1.0 + i}, "sampler": {}}
        for i in range(4)
    ]
    configs += [
        {"name": "g32", "family": "gmm", "params": {"dim": 1, "components": 1}, "sampler": {"dtype": "float32"}},
        {"name": "g3", "family": "gmm", "params": {"dim": 1, "components": 3}, "sampler": {}},
    ]

    def alone(y):
        found = [(f[0], i, f[1]) for i, c in enumerate(configs) if (f := screening.first_nonfinite_row(c, None, y))]
        return None if not found else min(found)[::2]

    for values in ([0.5, -1.0, 2.0], [0.5, 1e30, 2.0, 1e200], [0.5, 2.0, 1e200, 1e30], [1e200, 0.0]):
        y = torch.tensor(values, dtype=torch.float64)[:, None]
        assert screening.first_nonfinite_row_among(configs, None, y) == alone(y), values
    y = torch.tensor([0.5, 1e30], dtype=torch.float64)[:, None]
    assert screening.first_nonfinite_row_among(configs, None, y)[0] == 1  # float32 alone refuses (1e30)²
    assert "'g32'" in screening.first_nonfinite_row_among(configs, None, y)[1]


def test_a_streams_screening_follows_its_models(settings, monkeypatch):
    """The API keeps a stream's parsed configs and screening plan between chunks (service.routes.chunks.stream_configs)
    only while its models are those it was made for: a model created, deleted, or deleted and created again under the
    same name with another config is screened by its current config at the next chunk; a stream whose models did not
    change reads no config."""
    from service.routes import chunks as chunk_routes

    f64 = {"family": "gmm", "params": {"dim": 1, "components": 1}}
    f32 = {**f64, "sampler": {"dtype": "float32"}}
    big = {"y": [0.5, 1e30]}  # (1e30)² overflows float32 only: refused by a float32 model alone
    with TestClient(create_app(settings, workers=0)) as c:
        assert c.post("/v1/models", json={"name": "a", "stream": "s", **f64}).status_code == 201
        assert c.post("/v1/streams/s/chunks", json={"y": [0.5]}).status_code == 202
        reads = []
        monkeypatch.setattr(
            chunk_routes.screening, "plan", lambda cfgs, f=chunk_routes.screening.plan: reads.append(1) or f(cfgs)
        )
        assert c.post("/v1/streams/s/chunks", json={"y": [0.5]}).status_code == 202
        assert reads == []  # the models did not change: the kept plan
        assert c.post("/v1/streams/s/chunks", json=big).status_code == 202
        # the same name, another config: refused by it at once
        assert c.delete("/v1/models/a").status_code == 204
        assert c.post("/v1/models", json={"name": "a", "stream": "s", **f32}).status_code == 201
        res = c.post("/v1/streams/s/chunks", json=big)
        assert res.status_code == 422 and "'a'" in res.json()["detail"][0]["msg"], res.json()
        assert reads == [1]
        # a second model created, then deleted: the stream screened by the models it has at each chunk
        assert c.delete("/v1/models/a").status_code == 204
        assert c.post("/v1/models", json={"name": "b", "stream": "s", **f64}).status_code == 201
        assert c.post("/v1/streams/s/chunks", json=big).status_code == 202
        assert c.post("/v1/models", json={"name": "c", "stream": "s", **f32}).status_code == 201
        res = c.post("/v1/streams/s/chunks", json=big)
        assert res.status_code == 422 and "'c'" in res.json()["detail"][0]["msg"], res.json()
        assert c.delete("/v1/models/c").status_code == 204
        assert c.post("/v1/streams/s/chunks", json=big).status_code == 202
        # the stream deleted and created again: a new set of models, whatever the names
        assert c.delete("/v1/streams/s").status_code == 204
        assert c.post("/v1/models", json={"name": "b", "stream": "s", **f32}).status_code == 201
        res = c.post("/v1/streams/s/chunks", json=big)
        assert res.status_code == 422 and "'b'" in res.json()["detail"][0]["msg"], res.json()


def test_a_chunks_active_models_are_counted_without_reading_each(settings):
    """The chunk quota's count of a stream's active models comes from its sorted set of observation counts (errored
    models at +inf, as the worker writes them), and from each model's status where the set lacks a model (a stream
    written before it): the same count either way."""
    s = settings.model_copy(update={"max_pending_observations_per_tenant": 5})
    r = redis.Redis.from_url(s.redis_url)
    p = s.key_prefix
    with TestClient(create_app(s, workers=0)) as c:
        for name in ("a", "b", "c"):
            assert c.post("/v1/models", json={"name": name, "stream": "s", **SMALL_MODEL}).status_code == 201
        # as the worker writes an error: the status, and +inf in the stream's counts
        r.hset(f"{p}:default:ckpt:c", mapping={"status": "error", "observations": 0})
        r.zadd(f"{p}:default:stream:s:obs", {"c": "+inf"})
        # two active models: 2 values are 4 pending (<= 5), 3 more would be 6 more
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]] * 2, "y": [1, 2]}).status_code == 202
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]], "y": [1]}).status_code == 429
        import service.quotas

        service.quotas._cache.clear()
        r.zrem(f"{p}:default:stream:s:obs", "b")  # a model the set lacks: every status read
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]], "y": [1]}).status_code == 429
        r.hset(f"{p}:default:ckpt:a", mapping={"status": "ok", "observations": 2})
        r.hset(f"{p}:default:ckpt:b", mapping={"status": "ok", "observations": 2})
        service.quotas._cache.clear()
        assert c.post("/v1/streams/s/chunks", json={"x": [[1, 2]] * 2, "y": [1, 2]}).status_code == 202


def test_a_new_models_probes_are_drawn_at_its_registration(settings, monkeypatch):
    """The API draws a new model's screening probes when it registers the model, with the family it built to
    validate it: the stream's next chunk is screened without building that family again (a stream's first chunk
    after 128 registrations drew 128 models' probes); the screen still refuses what it refused."""
    screening._cache.clear()
    screening._stacks.clear()
    model = {"name": "fresh", "stream": "fresh", "family": "gmm", "params": {"dim": 1, "components": 1}}
    with TestClient(create_app(settings, workers=0)) as c:
        assert c.post("/v1/models", json=model).status_code == 201

        def refuse(*args, **kwargs):
            raise AssertionError("the probes were drawn at the chunk")

        monkeypatch.setattr(screening, "make_family", refuse)
        assert c.post("/v1/streams/fresh/chunks", json={"y": [0.5, 1.0]}).status_code == 202
        res = c.post("/v1/streams/fresh/chunks", json={"y": [0.5, 1e308]})
        assert res.status_code == 422 and "log-likelihood" in res.text, res.text


def test_large_bodies_are_parsed_in_the_parsing_process(hardened, settings):
    """Bodies over 1 MiB take the out-of-process path: same acks, same 422s (with the row), over HTTP and
    over the WebSocket."""
    rows = 60_000  # ~1.1 MB of JSON
    x = [[0.25, -1.5]] * rows
    body = json.dumps({"seq": 2, "x": x, "y": [0.5] * rows})
    assert len(body) > 2**20
    res = hardened.post("/v1/streams/s/chunks", content=body, headers=J)
    assert res.status_code == 202 and res.json()["n_observations"] == rows, res.text
    poisoned = json.dumps({"x": x, "y": [0.5] * (rows - 1) + [1e300]})
    res = hardened.post("/v1/streams/s/chunks", content=poisoned, headers=J)
    assert res.status_code == 422 and res.json()["detail"][0]["loc"][:2] == ["body", "y"]
    assert "log-likelihood" in res.json()["detail"][0]["msg"]
    with hardened.websocket_connect("/v1/streams/s/events") as ws:
        ws.send_text(json.dumps({"type": "chunk", "seq": 3, "x": x, "y": [1.5] * rows}))
        msg = ws.receive_json()
        assert msg["type"] == "ack" and msg["seq"] == 3 and msg["first_index"] == 1 + rows, msg
    assert hardened.get("/v1/streams/s").json()["observations"] == 1 + 2 * rows


def test_redis_unreachable_is_503_with_retry_after(settings):
    """Nothing listens on the port: every route is 503 + Retry-After (was 500), the WebSocket handshake
    too, /readyz 503.  (Redis frozen and killed under a live server: tests/integration/test_faults.py.)"""
    import socket

    from starlette.testclient import WebSocketDenialResponse

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: connections are refused
    s = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0", "api_redis_timeout_seconds": 0.5})
    with TestClient(create_app(s, workers=0)) as c:
        for method, path, body in [
            ("GET", "/v1/models", None),
            ("POST", "/v1/models", {"name": "m", **SMALL_MODEL}),
            ("GET", "/v1/models/m/evidence", None),
            ("POST", "/v1/streams/s/chunks", {"x": [[1, 2]], "y": [1]}),
            ("DELETE", "/v1/streams/s", None),
            ("GET", "/v1/alerts", None),
        ]:
            res = c.request(method, path, json=body)
            assert res.status_code == 503 and res.headers["retry-after"] == "1", (path, res.text)
        assert c.get("/readyz").status_code == 503
        with pytest.raises(WebSocketDenialResponse) as err, c.websocket_connect("/v1/streams/s/events"):
            pass
        assert err.value.status_code == 503 and err.value.headers["retry-after"] == "1"
