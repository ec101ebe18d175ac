"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Response

from service.deps import KeysDep, RedisDep, SettingsDep
from service.metrics import redis_metrics
from service.schemas import Health, Ready

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, Any]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Ready, responses={503: {"model": Ready, "description": "not ready"}})
async def readyz(r: RedisDep, keys: KeysDep, settings: SettingsDep, response: Response) -> dict[str, Any]:
    """Ready when Redis answers and at least one worker's heartbeat is fresh (within 3 periods)."""
    try:
        await r.ping()
        workers = await r.zcount(keys.workers, time.time() - 3 * settings.heartbeat_seconds, "+inf")
        ok = True
    except Exception:  # noqa: BLE001 - any Redis failure means not ready
        ok, workers = False, 0
    ready = ok and workers > 0
    if not ready:
        response.status_code = 503
    return {"status": "ready" if ready else "not ready", "redis": ok, "workers": workers}


@router.get(
    "/metrics",
    response_class=Response,
    response_model=None,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(r: RedisDep, keys: KeysDep, settings: SettingsDep) -> Response:
    """Prometheus metrics (text format 0.0.4)."""
    body = await redis_metrics(r, keys, settings.heartbeat_seconds)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
