"""Per-tenant quotas (API.md "Models", issue 11): models, and pending observations (the backlog).

A tenant's backlog is the number of stream observations its models (those not in ``error``) have still
to absorb, summed over the models: the work its data has queued for the workers.  It is read with one Lua
script (:func:`workers.store.streams.tenant_backlog`, O(models of the tenant) inside Redis) at most once
per :data:`CACHE_SECONDS` per tenant and process; observations this process accepts in between are added
to the cached value, so a burst of chunks is bounded without a Redis scan per chunk.
"""

from __future__ import annotations

import time

from fastapi import HTTPException, status

from workers.config import Settings
from workers.store.keys import Keys
from workers.store.streams import tenant_backlog

CACHE_SECONDS = 1.0
RETRY_AFTER_SECONDS = 5
_cache: dict[tuple[str, str], tuple[float, int, int]] = {}  # (prefix, tenant) -> (read at, models, pending)


def _too_many(msg: str) -> HTTPException:
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, msg, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


async def _backlog(r, keys: Keys, tenant: str, fresh: bool = False) -> tuple[int, int]:
    key = (keys.prefix, tenant)
    hit = _cache.get(key)
    now = time.monotonic()
    if fresh or hit is None or now - hit[0] > CACHE_SECONDS:
        models, pending = await tenant_backlog(r, keys, tenant)
        _cache[key] = (now, models, pending)
        return models, pending
    return hit[1], hit[2]


def _add(keys: Keys, tenant: str, observations: int) -> None:
    hit = _cache.get((keys.prefix, tenant))
    if hit is not None:
        _cache[(keys.prefix, tenant)] = (hit[0], hit[1], hit[2] + observations)


async def check_model_quota(r, keys: Keys, settings: Settings, tenant: str, stream: str) -> None:
    """429 when one more model would exceed ``max_models_per_tenant``, or when a model starting from the
    stream's first observation would push the backlog over ``max_pending_observations_per_tenant``."""
    models, pending = await _backlog(r, keys, tenant, fresh=True)
    if models + 1 > settings.max_models_per_tenant:
        raise _too_many(f"tenant has {models} models, the quota is {settings.max_models_per_tenant}")
    existing = int(await r.hget(keys.meta(tenant, stream), "observations") or 0)
    if pending + existing > settings.max_pending_observations_per_tenant:
        raise _too_many(
            f"a new model on stream {stream!r} must absorb {existing} observations; the tenant's models have "
            f"{pending} pending; the quota is {settings.max_pending_observations_per_tenant}"
        )


async def check_chunk_quota(r, keys: Keys, settings: Settings, tenant: str, stream_models: int, n: int) -> None:
    """429 when ``n`` more observations for ``stream_models`` models would exceed the tenant's backlog quota."""
    _, pending = await _backlog(r, keys, tenant)
    added = n * stream_models
    if pending + added > settings.max_pending_observations_per_tenant:
        raise _too_many(
            f"the tenant's models have {pending} observations pending; {n} more for {stream_models} models "
            f"would exceed the quota {settings.max_pending_observations_per_tenant}: retry when they have caught up"
        )


def accepted(keys: Keys, tenant: str, stream_models: int, n: int) -> None:
    """Count observations accepted by this process into the cached backlog."""
    _add(keys, tenant, n * stream_models)
