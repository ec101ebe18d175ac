"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Response, status

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
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
        401: {"description": "an Authorization header that is not the metrics key"},
    },
)
async def metrics(
    r: RedisDep, keys: KeysDep, settings: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> Response:
    """Prometheus metrics (text format 0.0.4).

    With API keys configured, the series that name tenants, streams or models are exported only to
    ``Authorization: Bearer <SGAIS_METRICS_KEY>``; without a header only unlabelled aggregates; any
    other header is 401 (a misconfigured scraper shows as down instead of silently losing series).
    """
    labelled = True
    if settings.api_keys.strip():
        expected = f"Bearer {settings.metrics_key}"
        if authorization is None:
            labelled = False
        elif not settings.metrics_key or not secrets.compare_digest(authorization.encode(), expected.encode()):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "wrong metrics key", headers={"WWW-Authenticate": "Bearer"}
            )
    body = await redis_metrics(r, keys, settings.heartbeat_seconds, labelled=labelled)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
