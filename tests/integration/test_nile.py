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


def test_the_nile_dam_is_the_only_change_point_whatever_the_chunking(settings) -> None:
    """Acceptance 2 on chunks of one observation, and acceptance 4 (1 or 50 observations per chunk give the same
    alerts, location within ±1) on the same series posted in chunks of 50 to another stream.  Not chunks of 5: there
    the AR(1) raises no alert (``python bench/nile.py --chunks 1,5,50``, session 21: the drop of the block's tail at
    28-29 is below ``spawn_z``, so no challenger starts at 28, and the later ones do not reach the confirmation
    level); the gmm finds 28 at every chunking.  The AR(1) in chunks of 50 confirms 28 only at the series' last value
    (its log Bayes factor crosses the confirmation level there): the seeds are counted in process below."""
    y = np.loadtxt(NILE, delimiter=",", skiprows=1)[:, 1]
    z = (y - y.mean()) / y.std()
    sizes = (1, 50)
    with TestClient(create_app(settings, workers=0)) as api:
        for size in sizes:
            for name, body in MODELS.items():
                model = {"name": f"{name}-{size}", "stream": f"nile-{size}", **body}
                assert api.post("/v1/models", json=model).status_code == 201
        worker = Worker(settings)
        for size in sizes:
            for seq, a in enumerate(range(0, len(z), size), start=1):
                chunk = {"seq": seq, "y": z[a : a + size].tolist()}
                assert api.post(f"/v1/streams/nile-{size}/chunks", json=chunk).status_code == 202
                if seq % 10 == 0:  # a live feed: the worker keeps up, a few chunks per round
                    run_until_idle(worker)
        run_until_idle(worker)
        for size in sizes:
            models = api.get(f"/v1/streams/nile-{size}").json()["models"]
            assert all(m["observations_processed"] == len(z) for m in models), models
        alerts = api.get("/v1/alerts", params={"kind": "change_point"}).json()["items"]
        statuses = {m: api.get(f"/v1/models/{m}-{s}/evidence").json()["status"] for m in MODELS for s in sizes}
    found = {
        (name, size): [a["observation_index"] for a in alerts if a["model"] == f"{name}-{size}"]
        for name in MODELS
        for size in sizes
    }
    for name in MODELS:
        (at,) = found[(name, 1)]
        assert abs(at - 28) <= 5, found
        for size in sizes:
            assert len(found[(name, size)]) == 1 and abs(found[(name, size)][0] - at) <= 1, found
    assert set(statuses.values()) == {"ok"}, statuses


def test_the_nile_in_chunks_of_50_under_ar1_over_seeds() -> None:
    """The AR(1) with default settings (seeds 0-9) on the standardised Nile in chunks of 50, in process: each raises
    one ``change_point`` at 28, detected at the last value (99), and no other (measured, session 34, as at 07ce62d).
    A chunk of 50 holds the change: its challenger is placed by the in-block split of the first block's rows, and
    the Bayes factor (exact: 9.25 nats at the end) reaches the confirmation level only at the series' end.  With one
    Gibbs sweep after the SGHMC steps instead of two in their place (session 34's first version) 7 of 10 did: the
    others' split placed the challenger at 18."""
    from workers.changepoint import ChangepointSettings
    from workers.segmented import SegmentedEngine

    y = np.loadtxt(NILE, delimiter=",", skiprows=1)[:, 1]
    z = (y - y.mean()) / y.std()
    found = []
    for seed in range(10):
        eng = SegmentedEngine.create("autoregressive", {"order": 1}, {"seed": seed}, ChangepointSettings())
        alerts = []
        for a in range(0, len(z), 50):
            eng.update(None, z[a : a + 50].tolist())
            alerts += [(al["observation_index"], al["detected_at_index"]) for al in eng.take_alerts()]
        found.append(alerts)
    assert all(alerts == [(28, 99)] for alerts in found), found
