"""``/metrics`` (API.md "Operations"): alerts by stream and kind, model status, deleted models' series
removed, and the metrics key (hardening review F5) against a real Redis and a real worker."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.metrics import ALERT_KINDS
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks

SERIES = re.compile(r"^(sgais_[a-z_]+)(\{[^}]*\})? (\S+)$", re.M)


def series(text: str, name: str) -> dict[str, float]:
    """``{label string: value}`` of one metric in a scrape, the labels sorted by name (``{a="1",b="2"}``)."""
    return {_sorted(labels): float(v) for n, labels, v in SERIES.findall(text) if n == name}


def _sorted(labels: str) -> str:
    return "{" + ",".join(sorted(labels.strip("{}").split(","))) + "}" if labels else ""


def create(client, name, stream, **extra):
    res = client.post("/v1/models", json={"name": name, "stream": stream, **SMALL_MODEL, **extra})
    assert res.status_code == 201, res.text


def caught_up(client, stream, chunks):
    body = client.get(f"/v1/streams/{stream}").json()
    return all(m["chunks_processed"] == chunks for m in body["models"]) and body


def shifted_chunks():
    """Two chunks of the linear model's data, the second shifted by +8 (a change the drop detector sees)."""
    first, second = linear_chunks(2, 200, seed=5)
    second["y"] = [v + 8.0 for v in second["y"]]
    return [first, second]


@pytest.fixture
def client(settings):
    # a long lease: the block after the +8 shift re-anneals, which on a loaded CI machine can outlast the
    # fixture's 2 s lease (leases are renewed between blocks); this test is about the metrics
    with TestClient(create_app(settings.model_copy(update={"lease_ttl_seconds": 120.0}), workers=1)) as c:
        yield c


def test_alerts_by_stream_and_kind_status_and_deleted_models(client):
    create(client, "a", "s-alert", sampler={**SMALL_MODEL["sampler"], "block_size": 50})
    create(client, "quiet", "s-quiet")
    # a model leased by the worker but without data yet (empty last block) is scraped fine
    wait_until(lambda: client.get("/v1/models/quiet/evidence").json()["status"] == "ok", timeout=60)
    res = client.get("/metrics")
    assert res.status_code == 200 and 'model="quiet"' in res.text
    for c in shifted_chunks():
        assert client.post("/v1/streams/s-alert/chunks", json=c).status_code == 202
    client.post("/v1/streams/s-quiet/chunks", json=linear_chunks(1, 50, seed=2)[0])
    wait_until(lambda: caught_up(client, "s-alert", 2) and caught_up(client, "s-quiet", 1), timeout=120)
    alerts = client.get("/v1/alerts", params={"stream": "s-alert", "kind": "evidence_drop"}).json()["items"]
    assert alerts, "the +8 shift raised no evidence_drop alert"
    text = client.get("/metrics").text
    by_stream = series(text, "sgais_stream_alerts_total")
    key = '{kind="evidence_drop",stream="s-alert",tenant="default"}'
    assert by_stream[key] == len(alerts)
    quiet = {k: v for k, v in by_stream.items() if 'stream="s-quiet"' in k}
    assert len(quiet) == len(ALERT_KINDS) and set(quiet.values()) == {
        0.0
    }  # every kind starts at 0 (increase() sees the first)
    status = series(text, "sgais_model_status")
    for m, stream in (("a", "s-alert"), ("quiet", "s-quiet")):
        one_hot = {k: v for k, v in status.items() if f'model="{m}"' in k}
        assert len(one_hot) == 4 and sum(one_hot.values()) == 1.0  # pending, ok, degraded, error
        assert one_hot[f'{{model="{m}",status="ok",stream="{stream}",tenant="default"}}'] == 1.0
    assert series(text, "sgais_models")['{status="ok"}'] == 2.0
    assert series(text, "sgais_alerts_total")['{kind="evidence_drop"}'] >= len(alerts)

    # deleting a model removes every series naming it; its stream's alert series go with its last model
    assert client.delete("/v1/models/a").status_code == 204
    text = client.get("/metrics").text
    assert 'model="a"' not in text and 'stream="s-alert"' not in text
    assert 'model="quiet"' in text


def test_status_pending_without_a_worker(settings):
    with TestClient(create_app(settings, workers=0)) as c:
        create(c, "p", "s-p")
        text = c.get("/metrics").text
    status = series(text, "sgais_model_status")
    assert status['{model="p",status="pending",stream="s-p",tenant="default"}'] == 1.0
    assert status['{model="p",status="ok",stream="s-p",tenant="default"}'] == 0.0
    assert series(text, "sgais_models")['{status="pending"}'] == 1.0


@pytest.fixture
def keyed_settings(settings):
    return settings.model_copy(update={"api_keys": "alpha=ka,beta=kb", "metrics_key": "mk"})


def test_metrics_key_guards_labelled_series(keyed_settings):
    with TestClient(create_app(keyed_settings, workers=0)) as c:
        res = c.post("/v1/models", json={"name": "secret", **SMALL_MODEL}, headers={"Authorization": "Bearer ka"})
        assert res.status_code == 201, res.text
        anonymous = c.get("/metrics")
        tenant_key = c.get("/metrics", headers={"Authorization": "Bearer ka"})
        wrong = c.get("/metrics", headers={"Authorization": "Bearer nope"})
        full = c.get("/metrics", headers={"Authorization": "Bearer mk"})
    assert anonymous.status_code == 200
    assert "secret" not in anonymous.text and "alpha" not in anonymous.text and "tenant=" not in anonymous.text
    assert series(anonymous.text, "sgais_models")['{status="pending"}'] == 1.0  # the aggregate is there
    assert tenant_key.status_code == 401 and wrong.status_code == 401  # only the metrics key unlocks
    assert full.status_code == 200
    assert series(full.text, "sgais_model_status")['{model="secret",status="pending",stream="secret",tenant="alpha"}']


def test_keys_configured_without_a_metrics_key_never_label(settings):
    s = settings.model_copy(update={"api_keys": "alpha=ka", "metrics_key": ""})
    with TestClient(create_app(s, workers=0)) as c:
        c.post("/v1/models", json={"name": "secret", **SMALL_MODEL}, headers={"Authorization": "Bearer ka"})
        assert "secret" not in c.get("/metrics").text
        assert c.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401


def test_model_probability_gauge_is_the_stream_posteriors_on_aligned_observations(client):
    """``sgais_model_probability`` scores the models as ``GET /v1/streams/{stream}/posterior`` does, on the
    observations after the stream's largest context (an AR(2) beside a gmm, extreme first values: scored on
    all observations, the gmm would lose about 7 nats, issue 10)."""
    sampler = {"particles": 10, "burn_in": 5, "block_size": 10, "seed": 3}
    for name, family, params in (("ar2", "autoregressive", {"order": 2}), ("g1", "gmm", {"dim": 1, "components": 1})):
        res = client.post(
            "/v1/models", json={"name": name, "stream": "s-ar", "family": family, "params": params, "sampler": sampler}
        )
        assert res.status_code == 201, res.text
    ys = [3.0, -2.5] + [0.1 * ((7 * i) % 11 - 5) for i in range(28)]
    assert client.post("/v1/streams/s-ar/chunks", json={"y": ys}).status_code == 202
    wait_until(lambda: caught_up(client, "s-ar", 1), timeout=120)
    post = client.get("/v1/streams/s-ar/posterior").json()
    assert post["conditioned_on"] == 2
    gauge = series(client.get("/metrics").text, "sgais_model_probability")
    for m in post["models"]:
        assert gauge[f'{{model="{m["model"]}",stream="s-ar",tenant="default"}}'] == pytest.approx(m["probability"])
