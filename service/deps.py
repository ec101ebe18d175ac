"""FastAPI dependencies: settings, Redis, key names and the caller's tenant.

They are ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hand-off
per dependency per request.  The settings come from the app (``app.state.settings``) rather than
through ``app.dependency_overrides``, with which FastAPI re-analyses every dependency's signature on
every request."""

from __future__ import annotations

import secrets
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, HTTPException, Request, WebSocket, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from workers.config import Settings
from workers.store.keys import Keys


async def get_app_settings(connection: HTTPConnection) -> Settings:
    """The settings the app was created with (``create_app``)."""
    return connection.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
_bearer = HTTPBearer(auto_error=False, description="API key of a tenant (SGAIS_API_KEYS)")


async def get_redis(request: Request) -> aioredis.Redis:
    """The app's Redis client (opened by the lifespan)."""
    return request.app.state.redis


async def get_keys(settings: SettingsDep) -> Keys:
    return Keys(settings.key_prefix)


def tenant_for_key(settings: Settings, key: str | None) -> str | None:
    """Tenant of ``key``; "default" when no keys are configured; None for a missing/wrong key."""
    keys = settings.tenants_by_key()
    if not keys:
        return "default"
    if key is None:
        return None
    for known, tenant in keys.items():
        if secrets.compare_digest(known.encode(), key.encode()):
            return tenant
    return None


async def get_tenant(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    """The caller's tenant from ``Authorization: Bearer <key>``; 401 when missing or wrong."""
    tenant = tenant_for_key(settings, credentials.credentials if credentials else None)
    if tenant is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return tenant


def websocket_tenant(websocket: WebSocket, settings: Settings) -> str | None:
    """Tenant of a WebSocket from its bearer header or ``?token=``; None when unauthorised."""
    key = websocket.query_params.get("token")
    header = websocket.headers.get("authorization", "")
    if key is None and header.lower().startswith("bearer "):
        key = header[7:].strip()
    return tenant_for_key(settings, key)


RedisDep = Annotated[aioredis.Redis, Depends(get_redis)]
KeysDep = Annotated[Keys, Depends(get_keys)]
TenantDep = Annotated[str, Depends(get_tenant)]
