"""A live feed through the service: one-component gmm models fed 5-observation chunks over HTTP (issue 9's
workload), against the bare engine on the same chunks in this process, on a quiet and on a loaded machine.

    python bench/live_feed.py [--chunks 40] [--models 1,8] [--load 0,2] [--redis-url URL]

For each model count and load (``--load N``: N CPU-bound processes run beside both sides), it starts from a fresh
stream, POSTs the chunks one at a time (no ``seq``) and waits on the live event socket until every model has
processed every chunk (``bench/service_overhead.py: service_run``); the bare side runs ``ModelEngine.update`` on
the same chunks for the same models.  Prints per-block milliseconds (elapsed / (chunks × models), a model-block
being one chunk absorbed by one model) of the bare engine, of the engine with its change-point challengers (what
the worker runs), and of the service end to end, and the ratio of the last two (the service's own overhead).
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time

import torch
from service_overhead import bare, free_port, service_run, start_server

from workers.alerts import AlertSettings
from workers.segmented import SegmentedEngine

CHUNK = 5


def gmm_model(i: int) -> dict:
    """One-component gmm, priors and seed varied per model (as issue 9's acceptance asks)."""
    params = {"dim": 1, "components": 1, "variance_shape": 1.0 + 0.1 * i, "variance_scale": 1.0 + 0.05 * i}
    return {"family": "gmm", "params": params, "sampler": {"seed": i}}


def segmented(data: list[dict], n_models: int) -> float:
    """Seconds for ``n_models`` engines with their change-point challengers (what the worker runs,
    :class:`workers.segmented.SegmentedEngine`, default settings) to absorb ``data``."""
    cp = AlertSettings().change_point
    engines = [SegmentedEngine.create(**gmm_model(i), settings=cp) for i in range(n_models)]
    t0 = time.perf_counter()
    for c in data:
        for eng in engines:
            eng.update(None, c["y"])
    return time.perf_counter() - t0


def chunks(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"y": (0.3 + torch.randn(CHUNK, generator=g, dtype=torch.float64)).tolist()} for _ in range(n)]


def _spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--models", default="1,8")
    ap.add_argument("--load", default="0,2", help="comma-separated numbers of CPU-bound processes beside the run")
    ap.add_argument("--redis-url", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = chunks(args.chunks)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(port, args.redis_url, tmp)
        base = f"http://127.0.0.1:{port}"
        try:
            print(
                f"{'load':>4} {'models':>6} {'bare ms/block':>14} {'+challengers':>13} {'service ms/block':>17} "
                f"{'service/+challengers':>21}"
            )
            for load in (int(v) for v in args.load.split(",")):
                hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(load)]
                for h in hogs:
                    h.start()
                try:
                    for n in (int(v) for v in args.models.split(",")):
                        t_bare = bare(data, n, gmm_model)
                        t_seg = segmented(data, n)
                        t_service, _ = service_run(base, f"live-{load}-{n}", data, n, in_flight=1, model_fn=gmm_model)
                        blocks = len(data) * n
                        print(
                            f"{load:>4} {n:>6} {1000 * t_bare / blocks:>14.1f} {1000 * t_seg / blocks:>13.1f} "
                            f"{1000 * t_service / blocks:>17.1f} {t_service / t_seg:>21.2f}",
                            flush=True,
                        )
                finally:
                    for h in hogs:
                        h.kill()
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
