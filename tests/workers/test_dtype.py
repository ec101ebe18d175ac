"""``sampler.dtype: float32`` (DESIGN.md §3: the particles' dtype; log-weights stay float64) for every family's
change-point engine.

Until session 33 the known-noise AR and linear regression raised at their first lag check (``index_add_(): self
(Double) and source (Float)``: the exact score's history part in float32 added to a float64 one), and a mixture's
particles became float64 at its first SGHMC step (its exact history gradient and the full preconditioner are formed
in float64 and promoted the update), so a float32 mixture ran and was stored in float64.
"""

from __future__ import annotations

import math

import torch

from tests.workers.test_device_agnostic import BLOCK, FAMILIES, SMALL, N, _stream
from workers.changepoint import ChangepointSettings
from workers.segmented import SegmentedEngine


def _run(family: str, params: dict, seed: int, dtype: str) -> tuple[SegmentedEngine, set[tuple], list[int]]:
    """The engine after the stream, the (particles, log-weights) dtypes of every population after every block, and
    the change points found."""
    x, y = _stream(family, params)
    eng = SegmentedEngine.create(family, params, {**SMALL, "seed": seed, "dtype": dtype}, ChangepointSettings())
    seen: set[tuple] = set()
    for a in range(0, N, BLOCK):
        eng.update(x[a : a + BLOCK] if x is not None else None, y[a : a + BLOCK])
        seen |= {(e.state.theta.dtype, e.state.log_w.dtype) for e in (eng.main, *(c.engine for c in eng.challengers))}
    return eng, seen, [a["observation_index"] for a in eng.take_alerts()]


def test_float32_particles_stay_float32_through_a_change_and_agree_with_float64() -> None:
    """Every population of every family keeps float32 particles (and float64 log-weights) block after block, finds
    the same change as the float64 run, and where both are certified its log-evidence agrees with float64's within
    4 standard errors of their difference: two estimates of one log Z whose Monte Carlo errors are taken as
    independent (the runs share a seed, but their arithmetic differs from the first draw on)."""
    for i, (family, params) in enumerate(FAMILIES):
        e32, seen, found32 = _run(family, params, i, "float32")
        e64, _, found64 = _run(family, params, i, "float64")
        assert seen == {(torch.float32, torch.float64)}, (family, params, seen)
        assert found32 == found64, (family, params, found32, found64)
        if not e32.degraded and not e64.degraded:
            se = math.hypot(e32.log_evidence_se, e64.log_evidence_se)
            assert abs(e32.log_evidence - e64.log_evidence) <= 4 * se, (
                family,
                params,
                e32.log_evidence,
                e64.log_evidence,
            )


def test_float32_models_through_the_service(settings) -> None:
    """Float32 models of a covariate family and of AR through a worker and a second worker that restores them from
    their checkpoints: every route that reads a model's state answers (evidence, posterior, predictive, the covariate
    family's at posted x rows), with the same values before and after the restore, and the restored particles are
    float32."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.integration.helpers import die, run_until_idle
    from workers.worker import Worker

    models = {"lr": ("linear_regression", {"features": 3}, "r"), "ar": ("autoregressive", {"order": 2}, "a")}
    streams = {"r": _stream("linear_regression", {}), "a": _stream("autoregressive", {"order": 1})}
    with TestClient(create_app(settings, workers=0)) as api:
        for name, (family, params, stream) in models.items():
            body = {"name": name, "stream": stream, "family": family, "params": params}
            assert api.post("/v1/models", json={**body, "sampler": {**SMALL, "dtype": "float32"}}).status_code == 201
        for a in range(0, N, BLOCK):
            x, y = streams["r"]
            assert (
                api.post("/v1/streams/r/chunks", json={"x": x[a : a + BLOCK], "y": y[a : a + BLOCK]}).status_code == 202
            )
            assert api.post("/v1/streams/a/chunks", json={"y": streams["a"][1][a : a + BLOCK]}).status_code == 202
        first = Worker(settings)
        run_until_idle(first)

        def read() -> dict:
            out = {}
            for name in models:
                out[name] = [
                    api.get(f"/v1/models/{name}/evidence").json(),
                    api.get(f"/v1/models/{name}/posterior").json(),
                ]
            out["ar"].append(api.get("/v1/models/ar/predictive", params={"horizon": 2}).json())
            rows = {"x": [[0.1, -0.2, 0.3], [1.0, 0.0, -1.0]]}  # a float32 model's x rows: they raised until session 33
            out["lr"].append(api.post("/v1/models/lr/predictive", json=rows).json())
            return out

        before = read()
        die(first)
        second = Worker(settings)
        run_until_idle(second)
        after = read()
        held = {h.name: h.engine for h in second.leases.snapshot()}
        alerts = api.get("/v1/alerts", params={"kind": "change_point"}).json()["items"]
        changes = {n: [a["observation_index"] for a in alerts if a["model"] == n] for n in models}
    for name in models:
        ev = before[name][0]
        assert ev["observations"] == N and ev["status"] in ("ok", "degraded") and math.isfinite(ev["log_evidence"])
        # a change-point model's particles describe the segment since its last change (an AR's with the lags before)
        since = N - max(changes[name], default=0)
        assert before[name][1]["parameters"] and since <= before[name][1]["observations"] <= since + 2
        assert held[name].main.state.theta.dtype == torch.float32
    assert before["ar"][2]["steps"] and len(before["lr"][2]["steps"]) == 2 and before == after


def test_float32_models_have_the_same_bits_after_a_restore() -> None:
    """Every family's float32 change-point engine, checkpointed after 80 of 100 values (past the change at 60) and
    restored from the stream, ends with the bits of the uninterrupted run (DESIGN.md §9, as for float64 in
    ``tests/workers/test_stack.py``)."""
    for i, (family, params) in enumerate(FAMILIES):
        x, y = _stream(family, params)

        def chunk(a: int, x=x, y=y) -> tuple:
            return (x[a : a + BLOCK] if x is not None else None), y[a : a + BLOCK]

        sampler = {**SMALL, "seed": i, "dtype": "float32"}
        full = SegmentedEngine.create(family, params, sampler, ChangepointSettings())
        part = SegmentedEngine.create(family, params, sampler, ChangepointSettings())
        for a in range(0, N, BLOCK):
            full.update(*chunk(a))
            if a < 80:
                part.update(*chunk(a))
        back = SegmentedEngine.restore(
            part.to_bytes(include_history=False),
            part.changepoint_bytes(),
            ChangepointSettings(),
            lambda: iter([chunk(s) for s in range(0, 80, BLOCK)]),
        )
        for a in range(80, N, BLOCK):
            back.update(*chunk(a))
        assert back.main.state.theta.dtype == torch.float32
        assert torch.equal(back.main.state.theta, full.main.state.theta), (family, params)
        assert back.log_evidence == full.log_evidence and back.log_evidence_se == full.log_evidence_se
