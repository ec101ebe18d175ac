"""``sgais serve``'s own process (``service.cli_server``): what it loads before it starts serving."""

from __future__ import annotations

import os
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


def test_a_worker_runs_torch_and_blas_on_its_thread_budget():
    """``workers.runner.limit_threads`` (every worker process, ``torch_threads``): torch's pool and the BLAS that
    numpy and scipy load (the Laplace fits' L-BFGS-B) on one thread; an unlimited OpenBLAS spun its idle threads
    through the optimiser's small vector operations (3.6x the fits' CPU, session 27)."""
    probe = (  # scipy.optimize imported after the limit, as a worker's warm_lazy_imports does
        "import torch\n"
        "from threadpoolctl import threadpool_info\n"
        "from workers.runner import limit_threads\n"
        "limit_threads(1)\n"
        "import scipy.optimize\n"
        "blas = {i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'}\n"
        "print(torch.get_num_threads(), sorted(blas))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split(maxsplit=1) == ["1", "[1]"]
