"""The ``sgais`` command line (typer).

Commands live in their own modules and register on :data:`app`:
``service.cli_server`` (serve, worker), ``service.cli_client`` (demo, models, post, watch) and
``service.cli_stream`` (export, plot, predict).
"""

from __future__ import annotations

import typer

app = typer.Typer(name="sgais", help="Streaming evidence service (SGAIS).", no_args_is_help=True)

# Register the commands (each module does `@app.command()` on this app).
import service.cli_client  # noqa: E402,F401  (demo, models, post, watch)
import service.cli_server  # noqa: E402,F401  (serve, worker)
import service.cli_stream  # noqa: E402,F401  (export, plot, predict)

if __name__ == "__main__":  # pragma: no cover
    # `python -m service.cli`: the commands registered on the importable module's app, not this copy's
    from service.cli import app as _app

    _app()
