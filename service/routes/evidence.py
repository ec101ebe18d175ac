"""Evidence, trace, parameter posterior and model comparison (API.md "Evidence", "Model comparison")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from service.deps import KeysDep, RedisDep, TenantDep
from service.schemas import Evidence, Name, Posterior, StreamPosterior, Trace
from workers.engine import posterior_summary_from_bytes
from workers.store import reads as store

router = APIRouter(prefix="/v1", tags=["evidence"])


@router.get("/models/{model}/evidence", response_model=Evidence)
async def get_evidence(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """Running log-evidence (nats) and the last processed block."""
    cfg = await store.get_model(r, keys, tenant, model)
    return await store.evidence(r, keys, tenant, cfg)


@router.get("/models/{model}/trace", response_model=Trace)
async def get_trace(
    model: Name,
    r: RedisDep,
    keys: KeysDep,
    tenant: TenantDep,
    since_index: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """Rows of processed blocks with ``first_index ≥ since_index``, in stream order (the evidence curve)."""
    return {"items": await store.trace(r, keys, tenant, model, since_index, limit)}


@router.get(
    "/models/{model}/posterior",
    response_model=Posterior,
    response_model_exclude_none=True,
    responses={409: {"description": "not yet initialised by a worker"}},
)
async def get_posterior(model: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """Posterior summary of every constrained parameter (weighted mean, std, 5%/95% quantiles; regression
    weights name the stream column of each entry), computed from the model's checkpoint when asked (the worker
    does not compute it for every chunk)."""
    state = await store.checkpoint_state(r, keys, tenant, model)
    return await run_in_threadpool(posterior_summary_from_bytes, state)


@router.get("/streams/{stream}/posterior", response_model=StreamPosterior)
async def get_stream_posterior(stream: Name, r: RedisDep, keys: KeysDep, tenant: TenantDep) -> dict[str, Any]:
    """Posterior model probabilities at the largest observation count every model has processed."""
    await store.get_meta(r, keys, tenant, stream)
    return await store.stream_posterior(r, keys, tenant, stream)
