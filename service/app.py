"""The FastAPI application: routers, middleware, and a lifespan that opens Redis and starts
in-process worker threads (``sgais serve --workers N``)."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import errors
from service.metrics import BodyLimitMiddleware, TimingMiddleware
from service.routes import alerts, chunks, events, evidence, models, ops, predictive, streams
from service.unavailable import OPENAPI_ERRORS, AllowHeaderMiddleware, api_redis
from service.unavailable import install as install_unavailable
from workers.config import Settings, get_settings


def create_app(settings: Settings | None = None, *, workers: int = 0) -> FastAPI:
    """Build the app. ``settings`` (default: the environment, :func:`get_settings`) are what the routes see;
    ``workers`` worker threads run in this process for the app's lifetime.
    """
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not settings.redis_url:
            raise RuntimeError("SGAIS_REDIS_URL is not set (sgais serve starts an embedded Redis)")
        app.state.redis = api_redis(settings)  # short timeouts, no retries: 503 within a second (issue 11)
        stop = threading.Event()
        threads = []
        if workers:
            import sys

            from workers.worker import Worker

            # the event loop must get the GIL back quickly from the worker threads' Python-heavy
            # small-tensor work, or request latency grows by the 5 ms default switch interval per await
            sys.setswitchinterval(0.0005)
            if settings.torch_threads:
                from workers.runner import limit_threads

                limit_threads(settings.torch_threads)

            for i in range(workers):
                w = Worker(settings, stop=stop)
                t = threading.Thread(target=w.run, name=f"sgais-worker-{i}", daemon=True)
                t.start()
                threads.append(t)
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
            await events.close_hub(app)  # the shared WebSocket subscription (issue 11)
            chunks.shutdown_pool()  # the large-body parsing process
            await app.state.redis.aclose()

    app = FastAPI(
        title="sgais",
        version="1",
        description="Streaming evidence service: running log-evidence, model probabilities and change-point "
        "alerts by SGAIS (API.md).",
        lifespan=lifespan,
    )
    app.state.settings = settings  # what the SettingsDep dependency returns
    errors.install(app)  # the store's domain errors -> 404 / 409 / 422
    for module in (models, chunks, evidence, alerts, events, ops, predictive, streams):
        app.include_router(module.router, responses=OPENAPI_ERRORS.get(module.__name__.rsplit(".", 1)[-1]))
    install_unavailable(app)  # Redis errors -> 503 + Retry-After (issue 11)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AllowHeaderMiddleware)  # 405s list every method of the path (issue 11)
    app.add_middleware(TimingMiddleware)
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory service.app:app_from_env`` (settings and workers from SGAIS_*)."""
    s = get_settings()
    return create_app(s, workers=s.workers)
