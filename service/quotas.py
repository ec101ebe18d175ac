"""Per-tenant quotas (API.md "Models", issue 11): models, and pending observations (the backlog).

A tenant's backlog is the number of stream observations its models (those not in ``error``) have still
to absorb, summed over the models: the work its data has queued for the workers.  It is read with one Lua
script (:func:`workers.store.streams.tenant_backlog`, O(models of the tenant) inside Redis) at most once
per :data:`CACHE_SECONDS` per tenant and process; observations this process accepts in between are added
to the cached value, so a burst of chunks or registrations is bounded without a Redis scan per request.  The
model count is exact (``SCARD`` of the tenant's models, per registration).
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


async def _backlog(r, keys: Keys, tenant: str) -> tuple[int, int]:
    key = (keys.prefix, tenant)
    hit = _cache.get(key)
    now = time.monotonic()
    if hit is None or now - hit[0] > CACHE_SECONDS:
        models, pending = await tenant_backlog(r, keys, tenant)
        _cache[key] = (now, models, pending)
        return models, pending
    return hit[1], hit[2]


def _add(keys: Keys, tenant: str, observations: int) -> None:
    hit = _cache.get((keys.prefix, tenant))
    if hit is not None:
        _cache[(keys.prefix, tenant)] = (hit[0], hit[1], hit[2] + observations)


async def check_model_quota(r, keys: Keys, settings: Settings, tenant: str, stream: str) -> int:
    """429 when one more model would exceed ``max_models_per_tenant``, or when a model starting from the
    stream's first observation would push the backlog over ``max_pending_observations_per_tenant``.  Returns those
    observations, for :func:`model_accepted`.

    The model count is read exactly (``SCARD``); the backlog as for chunks (:func:`_backlog`, at most
    :data:`CACHE_SECONDS` old plus what this process accepted since).  Read afresh at every registration, the backlog
    script's pass over every model of the tenant made registering K models O(K²) in Redis: 14-15 ms of Redis per
    registration at 1,000 models (the last hundred of 1,000 registrations on one stream), which every other client
    waited for (``python bench/api_scaling.py``)."""
    pipe = r.pipeline(transaction=False)
    pipe.scard(keys.tenant_models(tenant))
    pipe.hget(keys.meta(tenant, stream), "observations")
    models, existing = await pipe.execute()
    if int(models) + 1 > settings.max_models_per_tenant:
        raise _too_many(f"tenant has {models} models, the quota is {settings.max_models_per_tenant}")
    existing = int(existing or 0)
    _, pending = await _backlog(r, keys, tenant)
    if pending + existing > settings.max_pending_observations_per_tenant:
        raise _too_many(
            f"a new model on stream {stream!r} must absorb {existing} observations; the tenant's models have "
            f"{pending} pending; the quota is {settings.max_pending_observations_per_tenant}"
        )
    return existing


def model_accepted(keys: Keys, tenant: str, observations: int) -> None:
    """Count a model registered by this process, which has ``observations`` to absorb, into the cached backlog."""
    _add(keys, tenant, observations)


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
