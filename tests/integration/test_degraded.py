"""Issue 10 §3/§4 through the real worker and Redis: a model whose sampler cannot certify its value ends
``degraded`` with the reason in ``GET /v1/models/{m}/evidence``, and every trace row carries
``log_evidence_correction`` (0 when no re-annealing replaced the estimate; else the jump
``log Ẑ_replay − log Ẑ_running``, so that ``log_evidence`` = previous + ``log_predictive`` + correction)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import SMALL_MODEL, wait_until
from tests.integration.helpers import linear_chunks
from workers.runner import Worker


def test_uncertified_model_is_degraded_with_its_reason_and_rows_carry_the_correction(settings):
    sampler = {**SMALL_MODEL["sampler"], "block_size": 50}
    models = {
        "plain": sampler,
        # the first block needs ~15 annealing steps from the prior: a guard of 2 takes the rest in one increment
        "guarded": {**sampler, "max_annealing_steps": 2},
        # every block after the first marks a change: re-annealed at each doubling of the history (reanneal_growth)
        "replayed": {**sampler, "warmup_observations": 0, "reanneal_steps": 1},
    }
    with TestClient(create_app(settings, workers=0)) as api:
        for name, s in models.items():
            # no change-point challengers (workers/segmented.py): not under test here, and they cost engines
            alerts = {"change_point": {"enabled": False}}
            body = {"name": name, "stream": "s", **SMALL_MODEL, "sampler": s, "alerts": alerts}
            assert api.post("/v1/models", json=body).status_code == 201
        for chunk in linear_chunks(3, 100, seed=5):
            assert api.post("/v1/streams/s/chunks", json=chunk).status_code == 202
        worker = Worker(settings)
        worker.heartbeat()
        worker.scan()

        def processed() -> dict[str, dict] | None:
            worker.step()
            ev = {name: api.get(f"/v1/models/{name}/evidence").json() for name in models}
            return ev if all(e["observations"] == 300 for e in ev.values()) else None

        ev = wait_until(processed, timeout=600.0)
        traces = {name: api.get(f"/v1/models/{name}/trace").json()["items"] for name in models}

    assert ev["guarded"]["status"] == "degraded"
    assert "max_annealing_steps = 2" in ev["guarded"]["error"] and "not certified" in ev["guarded"]["error"]
    assert traces["guarded"][0]["guard_tripped"]
    for name in ("plain", "replayed"):
        assert ev[name]["status"] == "ok" and ev[name]["error"] is None, ev[name]

    for name, rows in traces.items():
        assert rows[-1]["observations"] == 300
        assert all("log_evidence_correction" in row for row in rows)
        assert all(row["log_evidence_correction"] == 0.0 for row in rows if not row["reannealed"]), name
    replayed = traces["replayed"]
    assert sum(row["reannealed"] for row in replayed) >= 2
    # a replay re-estimates the whole history with fresh draws: its log Ẑ differs from the running one
    assert all(row["log_evidence_correction"] != 0.0 for row in replayed if row["reannealed"])
    previous = 0.0
    for row in replayed:
        assert row["log_evidence"] == pytest.approx(
            previous + row["log_predictive"] + row["log_evidence_correction"], abs=1e-9
        )
        previous = row["log_evidence"]
