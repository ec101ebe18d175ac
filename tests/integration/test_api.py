"""Every endpoint of API.md against a real Redis and a real worker (thread in the app)."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks, reference_trace, strip


@pytest.fixture
def client(settings):
    with TestClient(create_app(settings, workers=1)) as c:
        yield c


def create(client, name, stream="s1", **extra):
    body = {"name": name, "stream": stream, **SMALL_MODEL, **extra}
    res = client.post("/v1/models", json=body)
    assert res.status_code == 201, res.text
    return res.json()


def processed(client, stream, chunks):
    body = client.get(f"/v1/streams/{stream}").json()
    return all(m["chunks_processed"] == chunks for m in body["models"]) and body


def test_models_crud_fills_sampler_defaults(client):
    m = create(client, "a", prior_probability=2.0)
    assert m["sampler"]["particles"] == 10 and m["sampler"]["block_size"] == 500  # default filled in
    assert m["sampler"]["device"] == "cpu" and m["alerts"]["enabled"] is True
    assert m["params"] == {
        "columns": None,
        "features": 2,
        "noise_std": 1.0,
        "prior_std": 1.0,
        "weight_location": 0.0,
        "intercept_location": 0.0,
        "variance_shape": 1.0,
        "variance_scale": 1.0,
        "weight_variance_ratio": 1.0,
    }
    assert client.post("/v1/models", json={"name": "a", **SMALL_MODEL}).status_code == 409
    assert client.get("/v1/models/a").json() == m
    assert [x["name"] for x in client.get("/v1/models").json()["items"]] == ["a"]
    assert client.delete("/v1/models/a").status_code == 204
    assert client.get("/v1/models/a").status_code == 404
    assert client.get("/v1/streams/s1").status_code == 200  # the stream stays


def test_schema_mismatch_is_422(client):
    create(client, "a")
    res = client.post(
        "/v1/models", json={"name": "b", "stream": "s1", "family": "linear_regression", "params": {"features": 3}}
    )
    assert res.status_code == 422 and "params" in res.text


def test_chunks_evidence_trace_posterior(client):
    create(client, "a")
    create(client, "b", sampler={**SMALL_MODEL["sampler"], "seed": 4}, prior_probability=3.0)
    chunks = linear_chunks(3, 300, seed=1)
    for c in chunks[:2]:
        res = client.post("/v1/streams/s1/chunks", json=c)
        assert res.status_code == 202, res.text
    res = client.post("/v1/models/a/chunks", json=chunks[2])  # the model's stream
    assert res.status_code == 202 and res.json() == {
        "stream": "s1",
        "seq": 3,
        "first_index": 600,
        "n_observations": 300,
        "duplicate": False,
    }
    replay = client.post("/v1/streams/s1/chunks", json=chunks[0])
    assert replay.status_code == 200 and replay.json()["duplicate"] is True and replay.json()["first_index"] == 0
    stream = wait_until(lambda: processed(client, "s1", 3))
    assert stream["chunks"] == 3 and stream["observations"] == 900
    assert stream["schema"] == {"x": 2, "y": [], "y_type": "real", "classes": None}

    ev = client.get("/v1/models/a/evidence").json()
    trace = client.get("/v1/models/a/trace").json()["items"]
    assert strip(trace) == strip(reference_trace({"name": "a", **SMALL_MODEL}, chunks))
    assert ev["observations"] == 900 and ev["chunks_processed"] == 3 and ev["chunks_pending"] == 0
    assert ev["log_evidence"] == trace[-1]["log_evidence"]
    # the error bar flows from the engine to the evidence resource and the trace (issue 10 §2)
    assert ev["log_evidence_se"] == trace[-1]["log_evidence_se"] > 0
    assert ev["log_evidence_per_observation"] == pytest.approx(ev["log_evidence"] / 900)
    assert ev["last_block"]["first_index"] == 600 and ev["last_block"]["observations"] == 300

    page = client.get("/v1/models/a/trace", params={"since_index": 300, "limit": 1}).json()["items"]
    assert [r["first_index"] for r in page] == [300]
    assert client.get("/v1/models/a/trace", params={"limit": 10001}).status_code == 422

    post = client.get("/v1/models/a/posterior").json()
    assert post["observations"] == 900 and set(post["parameters"]) == {"w", "b"}
    assert post["parameters"]["w"]["shape"] == [2]
    assert abs(post["parameters"]["w"]["mean"][1] - 2.0) < 0.5  # true w = (1, 2), 900 rows, noise 1

    sp = client.get("/v1/streams/s1/posterior").json()
    assert sp["observations"] == 900
    lz = {m["model"]: m["log_evidence"] for m in sp["models"]}
    p = {m["model"]: m["probability"] for m in sp["models"]}
    assert sum(p.values()) == pytest.approx(1.0)
    # p_b / p_a = 3 · exp(lz_b - lz_a)
    assert math.log(p["b"] / p["a"]) == pytest.approx(math.log(3.0) + lz["b"] - lz["a"], abs=1e-9)
    best = max(sp["models"], key=lambda m: m["probability"])
    assert best["log_bayes_factor"] == 0.0
    other = min(sp["models"], key=lambda m: m["probability"])
    assert other["log_bayes_factor_se"] == pytest.approx(math.hypot(other["log_evidence_se"], best["log_evidence_se"]))
    assert all(m["log_evidence_se"] > 0 for m in sp["models"])
    assert {m["model"]: m["log_bayes_factor"] for m in sp["models"]} == {m: lz[m] - best["log_evidence"] for m in lz}


def test_model_added_later_catches_up(client):
    create(client, "a")
    chunks = linear_chunks(2, 200, seed=2)
    for c in chunks:
        client.post("/v1/streams/s1/chunks", json=c)
    wait_until(lambda: processed(client, "s1", 2))
    create(client, "late")
    wait_until(lambda: processed(client, "s1", 2))
    trace = client.get("/v1/models/late/trace").json()["items"]
    assert strip(trace) == strip(reference_trace({"name": "late", **SMALL_MODEL}, chunks))


def test_websocket_events_and_chunk_ack(client):
    create(client, "a")
    chunks = linear_chunks(2, 100, seed=3)
    with client.websocket_connect("/v1/streams/s1/events") as ws:
        client.post("/v1/streams/s1/chunks", json=chunks[0])
        seen = set()
        while "evidence" not in seen or "posterior" not in seen:
            msg = ws.receive_json()
            seen.add(msg["type"])
            if msg["type"] == "evidence":
                # one event per block (the first values are one-observation blocks, workers/engine.py)
                assert msg["model"] == "a" and 1 <= msg["observations"] <= 100 and msg["last_block"]["seq"] == 1
        ws.send_json({"type": "chunk", **chunks[1]})
        while (msg := ws.receive_json())["type"] != "ack":
            pass
        assert msg == {
            "type": "ack",
            "stream": "s1",
            "seq": 2,
            "first_index": 100,
            "n_observations": 100,
            "duplicate": False,
        }
        ws.send_json({"type": "chunk", "seq": 3, "x": [[1.0, 2.0]], "y": ["a"]})
        while (msg := ws.receive_json())["type"] != "error":
            pass
        assert msg["status"] == 422 and "y" in str(msg["detail"])


@pytest.mark.slow
def test_alerts_on_a_change_point(client):
    create(client, "a", sampler={**SMALL_MODEL["sampler"], "block_size": 100})
    chunks = linear_chunks(8, 100, seed=4)
    for c in chunks[6:]:  # regime change: the intercept jumps by 8 noise standard deviations
        c["y"] = [v + 8.0 for v in c["y"]]
    for c in chunks:
        client.post("/v1/streams/s1/chunks", json=c)
    wait_until(lambda: processed(client, "s1", 8))
    items = client.get("/v1/alerts", params={"stream": "s1", "kind": "evidence_drop"}).json()["items"]
    assert items and items[0]["model"] == "a" and items[0]["observation_index"] >= 600
    # issue 12: the challengers' change_point (placed at a block start: 600), its probability and Bayes factor
    (cp,) = client.get("/v1/alerts", params={"stream": "s1", "kind": "change_point"}).json()["items"]
    assert cp["observation_index"] == 600 and cp["probability"] > 0.5 and cp["log_bayes_factor"] > 0
    rows = client.get("/v1/models/a/trace").json()["items"]
    assert all(0 <= r["change_probability"] <= 1 for r in rows) and [r["change_point"] for r in rows].count(True) == 1
    assert client.get("/v1/alerts", params={"model": "nope"}).json()["items"] == []
    assert client.get("/v1/alerts", params={"since": "2999-01-01T00:00:00Z"}).json()["items"] == []
    client.delete("/v1/models/a")
    assert client.get("/v1/alerts").json()["items"] == []


def test_ops_endpoints(client):
    create(client, "a")
    client.post("/v1/streams/s1/chunks", json=linear_chunks(1, 50)[0])
    wait_until(lambda: processed(client, "s1", 1))
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = wait_until(lambda: (r := client.get("/readyz")).status_code == 200 and r.json())
    assert ready["workers"] >= 1
    text = client.get("/metrics").text
    for name in (
        "sgais_log_evidence{",
        "sgais_log_evidence_se{",
        "sgais_log_evidence_per_observation{",
        "sgais_model_probability{",
        "sgais_observations_processed{",
        "sgais_chunks_pending{",
        "sgais_block_seconds_bucket",
        "sgais_annealing_steps{",
        "sgais_ess{",
        "sgais_chunks_ingested_total",
        "sgais_observations_ingested_total",
        "sgais_http_request_seconds_bucket",
        "sgais_worker_leases{",
        "sgais_worker_load{",
    ):
        assert name in text, name
    assert 'route="/v1/streams/{stream}/chunks"' in text
    assert client.get("/docs").status_code == 200


def test_readyz_without_workers_is_503(settings):
    with TestClient(create_app(settings, workers=0)) as c:
        res = c.get("/readyz")
        assert res.status_code == 503 and res.json()["redis"] is True and res.json()["workers"] == 0


MIXED = [("ar", "autoregressive", {"order": 1}), ("mix", "gmm", {"dim": 1, "components": 2})]


@pytest.mark.slow
@pytest.mark.parametrize("models", [MIXED, MIXED[::-1]], ids=["ar-first", "gmm-first"])
def test_families_with_different_layouts_share_a_stream(client, models):
    # An autoregressive model (y: [B]) and a 1-D mixture (y: [B, 1]) on one stream: the stream log
    # holds the layout of the first model's family; every model must lay it out its own way.
    sampler = {"particles": 6, "warmup_particles": None, "burn_in": 3, "block_size": 25, "seed": 1}
    for name, family, params in models:
        res = client.post(
            "/v1/models", json={"name": name, "stream": "mixed", "family": family, "params": params, "sampler": sampler}
        )
        assert res.status_code == 201, res.text
    y = [math.sin(0.3 * i) + 0.1 * (i % 7) for i in range(100)]
    assert client.post("/v1/streams/mixed/chunks", json={"seq": 1, "y": y}).status_code == 202
    body = wait_until(lambda: processed(client, "mixed", 1))
    assert {m["observations_processed"] for m in body["models"]} == {100}
    chunks = [{"seq": 1, "x": None, "y": y}]
    for name, family, params in models:
        evidence = client.get(f"/v1/models/{name}/evidence").json()
        assert evidence["status"] == "ok"
        trace = client.get(f"/v1/models/{name}/trace").json()["items"]
        model = {"family": family, "params": params, "sampler": sampler}
        assert strip(trace) == strip(reference_trace(model, chunks)), name
