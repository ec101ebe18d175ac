"""Issue 12, acceptance 2, as a user runs it: the Nile's annual flows (``tests/data/nile.csv``; the Aswan dam of 1898
is index 28), standardised as docs/priors.md asks, posted over HTTP one observation per chunk to a one-component
gmm and an AR(1) with default settings, read back from ``GET /v1/alerts``: one ``change_point`` alert per model,
within 5 observations of 28, and no other.  ``bench/nile.py`` runs the same engines in process (blocks of 1): gmm1
alerts at 28 (raised at 37), AR(1) at 28 (raised at 78), and so does the service here (session 33)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from service.app import create_app
from tests.integration.helpers import run_until_idle
from workers.worker import Worker

NILE = Path(__file__).resolve().parents[1] / "data" / "nile.csv"
MODELS = {
    "gmm1": {"family": "gmm", "params": {"dim": 1, "components": 1}},
    "ar1": {"family": "autoregressive", "params": {"order": 1}},
}


def test_the_nile_dam_is_the_only_change_point(settings) -> None:
    y = np.loadtxt(NILE, delimiter=",", skiprows=1)[:, 1]
    z = (y - y.mean()) / y.std()
    with TestClient(create_app(settings, workers=0)) as api:
        for name, body in MODELS.items():
            assert api.post("/v1/models", json={"name": name, "stream": "nile", **body}).status_code == 201
        worker = Worker(settings)
        for seq, v in enumerate(z.tolist(), start=1):
            assert api.post("/v1/streams/nile/chunks", json={"seq": seq, "y": [v]}).status_code == 202
            if seq % 10 == 0:  # a live feed: the worker keeps up, a few chunks per round
                run_until_idle(worker)
        run_until_idle(worker)
        assert all(m["observations_processed"] == 100 for m in api.get("/v1/streams/nile").json()["models"])
        alerts = api.get("/v1/alerts", params={"stream": "nile", "kind": "change_point"}).json()["items"]
        statuses = {name: api.get(f"/v1/models/{name}/evidence").json()["status"] for name in MODELS}
    found = {
        name: [(a["observation_index"], a["detected_at_index"]) for a in alerts if a["model"] == name]
        for name in MODELS
    }
    for name, at in found.items():
        assert len(at) == 1 and abs(at[0][0] - 28) <= 5, (name, found)
    assert statuses == {"gmm1": "ok", "ar1": "ok"}, statuses
