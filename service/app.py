"""The FastAPI application: routers, middleware, and a lifespan that opens Redis and starts
in-process worker threads (``sgais serve --workers N``)."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI

from service.metrics import BodyLimitMiddleware, TimingMiddleware
from service.routes import alerts, chunks, events, evidence, models, ops, predictive
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
        app.state.redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
        stop = threading.Event()
        threads = []
        if workers:
            import sys

            from workers.runner import Worker

            # the event loop must get the GIL back quickly from the worker threads' Python-heavy
            # small-tensor work, or request latency grows by the 5 ms default switch interval per await
            sys.setswitchinterval(0.0005)
            if settings.torch_threads:
                import torch

                torch.set_num_threads(settings.torch_threads)

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
            await app.state.redis.aclose()

    app = FastAPI(
        title="sgais",
        version="1",
        description="Streaming evidence service: running log-evidence, model probabilities and change-point "
        "alerts by SGAIS (API.md).",
        lifespan=lifespan,
    )
    app.state.settings = settings  # what the SettingsDep dependency returns
    for module in (models, chunks, evidence, alerts, events, ops, predictive):
        app.include_router(module.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(TimingMiddleware)
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory service.app:app_from_env`` (settings and workers from SGAIS_*)."""
    s = get_settings()
    return create_app(s, workers=s.workers)
