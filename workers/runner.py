"""The worker process: ``python -m workers.runner`` (or ``sgais worker --redis-url URL``) runs one
:class:`workers.worker.Worker` until SIGTERM/SIGINT, with its Prometheus metrics on ``SGAIS_METRICS_PORT``."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import traceback

from prometheus_client import start_http_server

from workers import lifeline
from workers.config import Settings, get_settings
from workers.worker import Worker
from workers.worker.loop import warm_lazy_imports
from workers.worker.metrics import WORKER_REGISTRY


def main(settings: Settings | None = None) -> None:
    """Run one worker until SIGTERM/SIGINT; metrics on ``SGAIS_METRICS_PORT`` when set."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings or get_settings()
    if not settings.redis_url:
        raise SystemExit("SGAIS_REDIS_URL (or --redis-url) is required for a standalone worker")
    if settings.torch_threads:
        limit_threads(settings.torch_threads)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=WORKER_REGISTRY)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    lifeline.watch_parent(stop)  # exit when the supervising `sgais serve` dies (SGAIS_PARENT_PID)
    worker = Worker(settings, stop=stop, warm=False)
    worker.begin()  # live (heartbeat) while it imports what torch and the Laplace start load on first use
    warm_lazy_imports()
    quiet_gc()  # after the imports: their objects are frozen too
    worker.run()


def limit_threads(n: int) -> None:
    """Run torch's intra-op pool and the BLAS libraries numpy and scipy load (the Laplace start's L-BFGS-B,
    ``workers.conflict``) on ``n`` threads (``torch_threads``).  Without the BLAS limit an OpenBLAS built for
    every core spun its idle threads through each of the optimiser's tiny vector operations: the 204 Laplace fits
    of the demo's two-component gmm took 25.0 s of CPU instead of 7.0 (session 27, ``OMP_NUM_THREADS`` unset)."""
    import scipy.optimize  # noqa: F401  (loads scipy's BLAS: a limit reaches only the libraries loaded already)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(limits=n, user_api="blas")


def quiet_gc() -> None:
    """Move everything loaded so far (torch, the service's modules: ~10⁶ objects) out of the cyclic garbage
    collector's view (``gc.freeze``) and collect the young generation 70× less often: a round of 128 models
    and their change-point challengers allocates tens of thousands of short-lived objects, and each full
    collection scanned every module's objects again.  Measured (engine level, 128 gmm models with challengers,
    20 five-observation blocks from scratch): 1.27–1.34 -> 1.17 ms CPU per model-block, as with the collector
    off.  Reference cycles are still collected, less often.  ``sgais serve`` applies it to the API process too
    (``service.cli_server``): there a full collection stalled every request for 144 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


if __name__ == "__main__":
    # Skip the interpreter's teardown of torch and friends (0.9 s measured, which every `sgais serve` shutdown
    # and the demo waited for), and on an error too: a teardown freezes the daemon threads, the lifeline's hard
    # exit among them, so a teardown that hung would outlive the supervisor.  Every commit is fenced: an exit at
    # any moment loses nothing.
    code = 1
    try:
        main()
        code = 0
    except SystemExit as err:  # sys.exit(): None is success, a message is printed and fails
        code = 0 if err.code is None else err.code if isinstance(err.code, int) else 1
        if isinstance(err.code, str):
            print(err.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
