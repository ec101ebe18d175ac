"""Redis unavailable → ``503`` with ``Retry-After`` within a second, on every route (API.md "Operations").

Redis down used to be a 500 on every data route and a frozen Redis held each request for redis-py's
default 5 s before a 500 (hardening review F6).  The API's client now has short socket and connect
timeouts (``SGAIS_API_REDIS_TIMEOUT_SECONDS``, default 0.5 s:
0.77-0.86 s to the 503 measured on a loaded 2-core machine) and no retries (redis-py 8 retries
three times by default, which would multiply the wait), and :func:`install` maps every Redis
connection or timeout error to a 503.  The worker's client is separate and unchanged (it retries).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.routing import Match

from service.schemas import ERROR_RESPONSES, NOT_FOUND
from workers.config import Settings

RETRY_AFTER_SECONDS = 1
#: Error responses of the routers whose modules do not list them (added by ``include_router``).
OPENAPI_ERRORS = {
    "evidence": {**ERROR_RESPONSES, **NOT_FOUND},
    "predictive": {**ERROR_RESPONSES, **NOT_FOUND},
    "alerts": ERROR_RESPONSES,
}


def api_redis(settings: Settings) -> aioredis.Redis:
    """The API's Redis client: short timeouts, no retries, a bounded pool (``SGAIS_API_REDIS_*``)."""
    assert settings.redis_url
    return aioredis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        socket_timeout=settings.api_redis_timeout_seconds,
        socket_connect_timeout=settings.api_redis_timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        max_connections=settings.api_redis_max_connections,
    )


def unavailable_response() -> JSONResponse:
    return JSONResponse(
        {"detail": "storage unavailable, retry later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return unavailable_response()


def install(app: FastAPI) -> None:
    """Answer 503 + Retry-After to Redis connection errors (refused, reset, pool exhausted, loading)
    and timeouts raised by any route."""
    app.add_exception_handler(RedisConnectionError, _redis_unavailable)
    app.add_exception_handler(RedisTimeoutError, _redis_unavailable)


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class AllowHeaderMiddleware:
    """A ``405`` lists every method the path accepts in ``Allow`` (Starlette lists those of the first
    route matching the path only: ``GET /v1/models`` and ``POST /v1/models`` are two routes)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_wrapper(message):
            if message["type"] == "http.response.start" and message["status"] == 405:
                routes = scope["app"].router.routes
                methods = {
                    m
                    for m in _METHODS
                    if any(route.matches({**scope, "method": m})[0] == Match.FULL for route in routes)
                }
                if "GET" in methods:
                    methods.add("HEAD")
                if methods:
                    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                    headers.append((b"allow", ", ".join(sorted(methods)).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_wrapper)
