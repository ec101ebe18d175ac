"""``GET/POST /v1/models/{model}/predictive`` (API.md "Operations") against a real Redis and worker."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks


def test_predictive_routes(settings):
    with TestClient(create_app(settings, workers=1)) as c:
        assert c.post("/v1/models", json={"name": "lin", "stream": "s", **SMALL_MODEL}).status_code == 201
        ar = {"name": "ar", "stream": "t", "family": "autoregressive", "params": {"order": 2, "noise_std": 1.0}}
        assert c.post("/v1/models", json={**ar, "sampler": SMALL_MODEL["sampler"]}).status_code == 201
        assert c.get("/v1/models/nope/predictive").status_code == 404
        c.post("/v1/streams/s/chunks", json=linear_chunks(1, 100, seed=1)[0])
        c.post("/v1/streams/t/chunks", json={"y": [0.1]})  # fewer values than the AR order
        done = lambda: all(  # noqa: E731
            m["chunks_processed"] == 1 for s in ("s", "t") for m in c.get(f"/v1/streams/{s}").json()["models"]
        )
        wait_until(done, timeout=120)

        res = c.get("/v1/models/lin/predictive")
        assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["query", "x"]
        res = c.post("/v1/models/lin/predictive", json={"x": [[0.0, 0.0], [1.0, 2.0]]})
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["model"] == "lin" and body["stream"] == "s" and body["observations"] == 100
        assert body["horizon"] == 2 and [s["step"] for s in body["steps"]] == [1, 2]
        # y = x·(1, 2) + 0.5 + N(0, 1): the mean at x = (1, 2) is near 5.5, its 90% interval about ±1.65
        s2 = body["steps"][1]
        assert abs(s2["mean"] - 5.5) < 1.0 and s2["q05"] < s2["mean"] < s2["q95"] and 2.5 < s2["q95"] - s2["q05"] < 4.5
        assert res.json() == c.post("/v1/models/lin/predictive", json={"x": [[0.0, 0.0], [1.0, 2.0]]}).json()
        bad = c.post("/v1/models/lin/predictive", json={"x": [[0.0, 0.0, 1.0]]})
        assert bad.status_code == 422 and "x[0]" in bad.text
        assert c.post("/v1/models/lin/predictive", json={"x": [[0.0, 0.0]], "y": [1]}).status_code == 422

        res = c.get("/v1/models/ar/predictive", params={"horizon": 3})
        assert res.status_code == 422 and "last 2 values" in res.text  # one value seen, AR(2) needs two
        c.post("/v1/streams/t/chunks", json={"y": [0.3, -0.2, 0.5, 0.1]})
        wait_until(lambda: c.get("/v1/models/ar/evidence").json()["chunks_processed"] == 2, timeout=120)
        res = c.get("/v1/models/ar/predictive", params={"horizon": 3})
        assert res.status_code == 200 and res.json()["horizon"] == 3, res.text
        assert c.get("/v1/models/ar/predictive", params={"horizon": 0}).status_code == 422
        assert c.post("/v1/models/ar/predictive", json={"x": [[1.0]]}).status_code == 422
