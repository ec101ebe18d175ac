"""Model comparison through the real worker and Redis (issue 10): a failed model is listed in the stream
posterior without a probability, raises no model_switch and makes ``wait_until_processed`` raise; and the
exact-evidence acceptance test: AR(1), AR(2) and a one-component gmm on one stream whose first values are
extreme, every log Bayes factor within 2.5 nats of the exact one on y_{3..n}."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import redis
from fastapi.testclient import TestClient

from models.conjugate import autoregressive_log_evidence, gmm_one_component_log_evidence
from service.app import create_app
from service.client import ModelFailedError, SgaisClient
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks, run_until_idle
from workers.runner import Worker
from workers.sgais import NumericalError
from workers.store.keys import Keys


@pytest.fixture
def api(settings):
    with TestClient(create_app(settings, workers=0)) as c:
        yield c


def events_of(r: redis.Redis, settings, action) -> list[dict]:
    pubsub = r.pubsub()
    pubsub.subscribe(Keys(settings.key_prefix).events("default", "s"))
    pubsub.get_message(timeout=5)  # the subscription confirmation
    action()
    events = []
    while (msg := pubsub.get_message(timeout=1)) is not None:
        events.append(json.loads(msg["data"]))
    pubsub.close()
    return events


def test_failed_leader_is_listed_raises_no_switch_and_stops_the_wait(api, settings):
    r = redis.Redis.from_url(settings.redis_url)
    # b: the same model with 100x the prior weight, so b leads; then b fails
    for name, extra in (
        ("a", {}),
        ("b", {"prior_probability": 100.0, "sampler": {**SMALL_MODEL["sampler"], "seed": 4}}),
    ):
        assert api.post("/v1/models", json={"name": name, "stream": "s", **SMALL_MODEL, **extra}).status_code == 201
    chunks = linear_chunks(2, 100, seed=2)
    assert api.post("/v1/streams/s/chunks", json=chunks[0]).status_code == 202
    worker = Worker(settings)
    run_until_idle(worker)
    assert json.loads(r.get(Keys(settings.key_prefix).leader("default", "s")))["model"] == "b"

    def diverge(*args, **kwargs):
        raise NumericalError("SGHMC diverged (test)")

    # the worker absorbs a model's block through SegmentedEngine._before_block (workers/segmented.advance_blocks)
    worker.held["default/b"].engine._before_block = diverge
    assert api.post("/v1/streams/s/chunks", json=chunks[1]).status_code == 202
    events = events_of(r, settings, lambda: run_until_idle(worker))

    post = api.get("/v1/streams/s/posterior").json()
    by = {m["model"]: m for m in post["models"]}
    assert post["observations"] == 200
    assert by["b"]["status"] == "error" and by["b"]["probability"] is None and "SGHMC diverged" in by["b"]["error"]
    assert by["a"]["status"] == "ok" and by["a"]["probability"] == pytest.approx(1.0)
    posteriors = [e for e in events if e["type"] == "posterior"]
    assert posteriors and {k: posteriors[-1][k] for k in post} == post  # the worker's event = the API's body
    assert api.get("/v1/alerts", params={"kind": "model_switch"}).json()["items"] == []
    assert json.loads(r.get(Keys(settings.key_prefix).leader("default", "s")))["model"] == "a"

    client = SgaisClient("http://testserver")
    client._http = api  # the TestClient is an httpx.Client on the app
    with pytest.raises(ModelFailedError) as err:
        client.wait_until_processed("s", timeout=30)
    assert err.value.model == "b" and "SGHMC diverged" in err.value.error and "b" in str(err.value)
    r.close()


# Acceptance 1.  n = 1000 in chunks of 500, default sampler.  tests/models/test_evidence.py measured the
# engine's error e = log Ẑ − log Z at n = 2000 over 8 seeds: sd 0.6 nats (AR with known noise) and 0.35
# (one-component gmm), mean ≈ −σ²/2; the error accumulates block by block, so at n = 1000 these bound it.
# A log Bayes factor's error then has sd √(0.6² + 0.6²) = 0.85 (AR vs AR) or
# √(0.6² + 0.35²) = 0.69 (AR vs gmm) and a mean within 0.12 of 0 (the Jensen terms nearly cancel), so
# 2.5 nats is ≥ 2.9 sd: a failure means a bias, not bad luck (P < 0.4% per factor if Gaussian).  The
# aligned values being compared on y_{3..n}, the 1-2 observations before c add nothing to that error.
N = 1000
TOL = 2.5


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_log_bayes_factors_within_tolerance_of_exact_on_extreme_first_values(api, settings):
    rng = np.random.default_rng(11)
    y = np.zeros(N)
    # about 4 sd from the stationary distribution (sd 1.15); at 8 and -7 the AR(2) model's SGHMC diverges on
    # y_3 (status error, the engine's prior-data conflict, issue 10 item 3)
    y[0], y[1] = 5.0, -4.0
    for t in range(2, N):
        y[t] = 0.5 * y[t - 1] + rng.normal()
    models = {
        "ar1": {"family": "autoregressive", "params": {"order": 1, "noise_std": 1.0}},
        "ar2": {"family": "autoregressive", "params": {"order": 2, "noise_std": 1.0}},
        "gmm": {"family": "gmm", "params": {"dim": 1, "components": 1}},
    }
    # without challengers: with them the AR(1) rightly confirms a change at 26 (log B̂ 8.25 ± 0.54; exact 9.98 by
    # models.conjugate on the two segments), after which its value is the evidence given that change, not the one
    # compared here
    off = {"change_point": {"enabled": False}}
    for i, (name, body) in enumerate(models.items()):
        body = {"name": name, "stream": "s", **body, "sampler": {"seed": 20 + i}, "alerts": off}
        res = api.post("/v1/models", json=body)
        assert res.status_code == 201, res.text
    for k in range(N // 500):
        chunk = {"seq": k + 1, "y": y[500 * k : 500 * (k + 1)].tolist()}
        assert api.post("/v1/streams/s/chunks", json=chunk).status_code == 202
    # a 60 s lease: on a loaded machine one 500-observation block can outlast the tests' 2 s lease
    worker = Worker(settings.model_copy(update={"lease_ttl_seconds": 60.0}))
    wait_until(lambda: run_until_idle(worker) or api.get("/v1/streams/s/posterior").json()["observations"] == N, 1200)

    post = api.get("/v1/streams/s/posterior").json()
    assert post["observations"] == N and post["conditioned_on"] == 2
    got = {m["model"]: m["log_evidence"] for m in post["models"]}
    exact = {
        "ar1": autoregressive_log_evidence(y, 1, 1.0) - autoregressive_log_evidence(y[:2], 1, 1.0),
        "ar2": autoregressive_log_evidence(y, 2, 1.0),
        "gmm": gmm_one_component_log_evidence(y) - gmm_one_component_log_evidence(y[:2]),
    }
    own = {m: api.get(f"/v1/models/{m}/evidence").json()["log_evidence"] for m in models}
    report = {m: (got[m], exact[m], own[m]) for m in models}
    for a, b in (("ar1", "ar2"), ("ar1", "gmm"), ("ar2", "gmm")):
        err = (got[a] - got[b]) - (exact[a] - exact[b])
        assert abs(err) < TOL, (a, b, err, report)
    # the models' own running values (main's comparison) are not on the same observations: the gmm's
    # Bayes factor against the AR models is off by the cost of y_1, y_2 (> TOL here)
    assert abs((own["gmm"] - own["ar2"]) - (exact["gmm"] - exact["ar2"])) > TOL, report
    print("aligned vs exact (got, exact, own running):", report)


def test_worker_event_and_api_agree_on_the_aligned_posterior(api, settings):
    """An AR(1) and a gmm on one stream: conditioned_on = 1, the gmm scored without y_1, the worker's
    posterior event equal to the API's body, and a model added later (AR(2)) raises c to 2."""
    r = redis.Redis.from_url(settings.redis_url)
    sampler = {"particles": 10, "burn_in": 5, "seed": 1}
    for name, family, params in (("ar1", "autoregressive", {"order": 1}), ("gmm", "gmm", {"dim": 1, "components": 1})):
        body = {"name": name, "stream": "s", "family": family, "params": params, "sampler": sampler}
        assert api.post("/v1/models", json=body).status_code == 201
    y = [0.3 * math.sin(i / 2) for i in range(30)]
    assert api.post("/v1/streams/s/chunks", json={"seq": 1, "y": y}).status_code == 202
    worker = Worker(settings.model_copy(update={"lease_ttl_seconds": 60.0}))
    events = events_of(r, settings, lambda: run_until_idle(worker))
    post = api.get("/v1/streams/s/posterior").json()
    assert post["observations"] == 30 and post["conditioned_on"] == 1
    assert {k: [e for e in events if e["type"] == "posterior"][-1][k] for k in post} == post
    gmm_rows = api.get("/v1/models/gmm/trace").json()["items"]
    by = {m["model"]: m for m in post["models"]}
    assert by["gmm"]["log_evidence"] == pytest.approx(gmm_rows[-1]["log_evidence"] - gmm_rows[0]["log_evidence"])
    assert gmm_rows[0]["observations"] == 1  # the first value is a block of its own

    body = {"name": "ar2", "stream": "s", "family": "autoregressive", "params": {"order": 2}, "sampler": sampler}
    assert api.post("/v1/models", json=body).status_code == 201
    run_until_idle(worker)
    post = api.get("/v1/streams/s/posterior").json()
    assert post["observations"] == 30 and post["conditioned_on"] == 2
    assert all(m["probability"] is not None for m in post["models"])
    r.close()
