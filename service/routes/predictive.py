"""Posterior predictive of the next observations (API.md "Operations"): ``GET /v1/models/{model}/predictive``
and, for the regression families, ``POST`` with covariate rows ``x``."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from models.predictive import PredictiveError, predictive
from service.deps import KeysDep, RedisDep, TenantDep
from service.schemas import BODY_RESPONSES, Name
from workers.engine import read_checkpoint
from workers.store import reads as store

router = APIRouter(prefix="/v1", tags=["evidence"])

MAX_HORIZON = 1000
MAX_ROWS = 10_000
TOTAL_DRAWS = 20_000  # simulated values per step over all particles (mean_se reports the simulation error)


class PredictiveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: list[list[float]] | None = Field(
        None, max_length=MAX_ROWS, description="covariate rows (regression families): one predicted step per row"
    )
    horizon: int | None = Field(None, ge=1, le=MAX_HORIZON, description="steps ahead (families without x)")


class PredictiveStep(BaseModel):
    step: int
    mean: float | list[float]
    std: float | list[float]
    q05: float | list[float]
    q95: float | list[float]
    mean_se: float | list[float] = Field(description="simulation Monte Carlo standard error of mean")


class Predictive(BaseModel):
    model: str
    stream: str
    observations: int
    horizon: int
    draws: int
    steps: list[PredictiveStep]


def predictive_from_bytes(data: bytes, *, x: Any, horizon: int) -> dict[str, Any]:
    """:func:`models.predictive.predictive` from a checkpoint (``ModelEngine.to_bytes``): its particles,
    log-weights, autoregressive context and a copy of the model's checkpointed generator (the same checkpoint
    and request give the same numbers; the model's own generator is not advanced)."""
    header, t, family = read_checkpoint(data)
    g = torch.Generator()
    g.set_state(t["generator"])
    out = predictive(
        family,
        t["theta"],
        t["log_w"],
        x=x,
        context=t.get("context"),
        horizon=horizon,
        total_draws=TOTAL_DRAWS,
        generator=g,
    )
    return {"observations": header["observations"], **out}


async def _answer(model: str, r, keys, tenant: str, *, x: Any, horizon: int, where: str) -> dict[str, Any]:
    cfg = await store.get_model(r, keys, tenant, model)
    state = await store.latest_particles(r, keys.checkpoint(tenant, model))
    if state is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"model {model!r} has not been picked up by a worker yet")
    try:
        body = await run_in_threadpool(predictive_from_bytes, state, x=x, horizon=horizon)
    except PredictiveError as err:
        loc = [where, err.field] if err.field in ("x", "horizon") else [where]
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": loc, "type": "value_error", "msg": err.reason}]
        ) from None
    return {"model": model, "stream": cfg["stream"], **body}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"description": "not yet initialised by a worker"},
    422: {"description": "bad x or horizon (x needed for regression families; too little context for AR)"},
}


@router.get(
    "/models/{model}/predictive",
    response_model=Predictive,
    responses=_RESPONSES,
)
async def get_predictive(
    model: Name,
    r: RedisDep,
    keys: KeysDep,
    tenant: TenantDep,
    horizon: Annotated[int, Query(ge=1, le=MAX_HORIZON)] = 1,
) -> dict[str, Any]:
    """Posterior predictive of the next ``horizon`` observations: per step the mean, std, 5% and 95% quantiles
    over the weighted particles × simulated observations (autoregressive: simulated recursively from the
    stream's last values). Regression families need covariate rows: use POST."""
    return await _answer(model, r, keys, tenant, x=None, horizon=horizon, where="query")


@router.post(
    "/models/{model}/predictive",
    response_model=Predictive,
    responses={**BODY_RESPONSES, **_RESPONSES},
)
async def post_predictive(
    model: Name, body: PredictiveIn, r: RedisDep, keys: KeysDep, tenant: TenantDep
) -> dict[str, Any]:
    """As GET, with ``x`` rows for the regression families (one predicted observation per row) or a
    ``horizon`` for the others."""
    return await _answer(model, r, keys, tenant, x=body.x, horizon=body.horizon or 1, where="body")
