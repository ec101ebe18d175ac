"""``sgais serve``'s own process (``service.cli_server``): what it loads before it starts serving."""

from __future__ import annotations

import subprocess
import sys

#: Runs ``sgais serve`` with uvicorn.run replaced by a probe: is sympy loaded (the first model registration needs it,
#: through ``torch.broadcast_shapes``) and out of the collector's view (frozen with the startup objects), and is
#: scipy.optimize (the worker's optimiser) and torch._dynamo left out of the API process?
PROBE = r"""
import gc
import sys

import uvicorn


def probe(app, **kwargs):
    loaded = "sympy" in sys.modules
    import sympy

    tracked = {id(o) for o in gc.get_objects()}
    print("sympy-loaded" if loaded else "sympy-missing")
    print("frozen" if id(sympy.Symbol) not in tracked else "tracked")
    print("dynamo" if "torch._dynamo" in sys.modules else "no-dynamo")
    print("optimiser" if "scipy.optimize" in sys.modules else "no-optimiser")


uvicorn.run = probe
from service.cli import app

app(["serve", "--workers", "0", "--redis-url", sys.argv[1]], standalone_mode=False)
"""


def test_serve_loads_and_freezes_what_the_first_registration_needs(redis_url):
    out = subprocess.run([sys.executable, "-c", PROBE, redis_url], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sympy-loaded", "frozen", "no-dynamo", "no-optimiser"]
