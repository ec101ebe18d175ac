"""Shared pieces of the client-side ``sgais`` commands: options, the console, one-line error handling.

(No import of :mod:`service.cli` here, so the command modules can import it in any order.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import typer
from rich.console import Console

from service.client import ApiError, SgaisClient

console = Console()

URL = typer.Option("http://127.0.0.1:8000", "--url", envvar="SGAIS_URL", help="service base URL")
API_KEY = typer.Option(None, "--api-key", envvar="SGAIS_API_KEY", help="bearer key (if the service has keys)")


def _client(url: str, api_key: str | None) -> SgaisClient:
    return SgaisClient(url, api_key)


def _fail(err: Exception, url: str | None = None) -> None:
    console.print(f"[red]error:[/red] {_one_line(err, url)}", soft_wrap=True)
    raise typer.Exit(1)


def _one_line(err: Exception, url: str | None = None) -> str:
    """A one-line account of a client error: unreachable server, rejected key, or the API's own message."""
    if isinstance(err, ApiError) and err.status == 401:
        return "the service rejected the API key (401): give --api-key or set SGAIS_API_KEY"
    if isinstance(err, httpx.TransportError | OSError):
        where = f" at {url}" if url else ""
        reason = f"{type(err).__name__}: {err}"
        return f"cannot reach the sgais service{where} ({reason}); is it running? set --url or SGAIS_URL"
    return " ".join(str(err).split())


@contextmanager
def handled(url: str) -> Iterator[None]:
    """Client errors (ApiError, connection failures) become one line on the console and exit code 1."""
    try:
        yield
    except (ApiError, httpx.TransportError, OSError) as err:
        _fail(err, url)
