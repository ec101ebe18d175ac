"""Change-point alerts (API.md "Alerts")."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BeforeValidator

from service.deps import KeysDep, RedisDep, TenantDep
from service.schemas import AlertList

router = APIRouter(prefix="/v1", tags=["alerts"])


def _iso_only(v: object) -> object:
    """``since`` is an ISO 8601 time (OpenAPI ``date-time``), not a Unix timestamp like ``0.5``."""
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return v
        raise ValueError("expected an ISO 8601 date-time, e.g. 2026-01-01T00:00:00Z")
    return v


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_only)]


@router.get("/alerts", response_model=AlertList)
async def list_alerts(
    r: RedisDep,
    keys: KeysDep,
    tenant: TenantDep,
    stream: str | None = None,
    model: str | None = None,
    kind: Annotated[str | None, Query(pattern="^(change_point|evidence_drop|annealing_spike|model_switch)$")] = None,
    since: Annotated[
        IsoDateTime | None, Query(description="only alerts created at or after this time (ISO 8601)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """Alerts of the tenant, oldest first, filtered by stream, model, kind and creation time."""
    low = since.timestamp() * 1000 if since is not None else "-inf"
    items = []
    for raw in await r.zrangebyscore(keys.alerts(tenant), low, "+inf"):
        a = json.loads(raw)
        if (
            (stream is None or a["stream"] == stream)
            and (model is None or a["model"] == model)
            and (kind is None or a["kind"] == kind)
        ):
            items.append(a)
            if len(items) >= limit:
                break
    return {"items": items}
