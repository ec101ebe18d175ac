"""The ``sgais`` command line (typer).

Commands live in their own modules and register on :data:`app`:
``service.cli_server`` (serve, worker) and ``service.cli_client`` (demo, models, post, watch).
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(name="sgais", help="Streaming evidence service (SGAIS).", no_args_is_help=True)

for _module in ("service.cli_server", "service.cli_client"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as err:  # a module still being written: keep the others usable
        if err.name != _module:
            raise

if __name__ == "__main__":  # pragma: no cover
    # `python -m service.cli`: the commands registered on the importable module's app, not this copy's
    from service.cli import app as _app

    _app()
