"""Shares of unequal models between two workers, through a real ``sgais serve --workers 2``: by count or by cost.

One costly model (a two-component gmm with ``burn_in`` 60: about 100 ms of engine per 5-value chunk after its
first 20, 17x a one-component gmm's 6 ms on the machine of session 32) and ``--light`` one-component gmm models
on two other streams, every stream fed a 5-value chunk every ``--interval`` seconds for ``--seconds``.  Shares by
count give each worker half the models, so the costly model's worker also holds half the light ones; with the
default interval (50 ms) that worker needed more than its core in session 32 and its models fell behind (with
0.13 s, the first guess from the in-process costs, neither worker saturated: the service's blocks cost less).
Shares by measured cost (``workers.worker.leases``) move light models off it once they have been held
``MIN_HOLD_SECONDS``.

Printed per window: each worker's CPU share (of one core), and the backlog (chunks posted and
not yet processed, summed over the models).  Run it against a base worktree too (``PYTHONPATH=<worktree>``: this
script and ``service_overhead.py`` come from the tree it lies in, the server from ``PYTHONPATH``).

    python bench/lease_balance.py [--seconds 150] [--interval 0.05] [--light 15] [--window 15]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_overhead import free_port, start_server  # noqa: E402

HEAVY = {"family": "gmm", "params": {"dim": 1, "components": 2}, "sampler": {"burn_in": 60, "seed": 0}}
LIGHT = {"family": "gmm", "params": {"dim": 1, "components": 1}}
CHUNK = 5


def worker_cpu(server: psutil.Process) -> dict[int, float]:
    """CPU seconds of each worker process (``workers.runner``) under ``server``."""
    out = {}
    for p in server.children(recursive=True):
        try:
            if "workers.runner" in " ".join(p.cmdline()):
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between a stream's chunks")
    ap.add_argument("--light", type=int, default=15, help="one-component gmm models (on two streams)")
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--redis-url", default=None, help="an external Redis (default: sgais serve's embedded one)")
    args = ap.parse_args()
    port, data = free_port(), tempfile.mkdtemp(prefix="sgais-balance-")
    proc = start_server(port, args.redis_url, data, workers=2)
    base = f"http://127.0.0.1:{port}"
    c = httpx.Client(base_url=base, timeout=30)
    try:
        streams = {"h": 1, "l0": 0, "l1": 0}
        assert c.post("/v1/models", json={"name": "heavy", "stream": "h", **HEAVY}).status_code == 201
        for i in range(args.light):
            s = f"l{i % 2}"
            body = {"name": f"light{i}", "stream": s, **LIGHT, "sampler": {"seed": i}}
            assert c.post("/v1/models", json=body).status_code == 201
        g = torch.Generator().manual_seed(0)
        posted = {s: 0 for s in streams}
        stop = threading.Event()

        def feed() -> None:
            feeder = httpx.Client(base_url=base, timeout=30)
            nxt = time.monotonic()
            while not stop.is_set():
                for s in streams:
                    y = (torch.randn(CHUNK, generator=g, dtype=torch.float64) + 0.5 * (posted[s] // 40 % 2)).tolist()
                    r = feeder.post(f"/v1/streams/{s}/chunks", json={"y": y, "seq": posted[s] + 1})
                    assert r.status_code == 202, r.text
                    posted[s] += 1
                nxt += args.interval
                stop.wait(max(nxt - time.monotonic(), 0.0))
            feeder.close()

        server = psutil.Process(proc.pid)
        feeder = threading.Thread(target=feed, daemon=True)
        t0 = time.monotonic()
        feeder.start()
        before = worker_cpu(server)
        print(f"{'t (s)':>6} | worker CPU share | backlog (chunks)")
        while time.monotonic() - t0 < args.seconds:
            time.sleep(args.window)
            now = worker_cpu(server)
            backlog = 0
            for s in streams:
                for m in c.get(f"/v1/streams/{s}").json()["models"]:
                    backlog += posted[s] - m["chunks_processed"]
            shares = [(now[p] - before.get(p, 0.0)) / args.window for p in sorted(now)]
            before = now
            print(f"{time.monotonic() - t0:6.0f} | " + " / ".join(f"{x:.2f}" for x in shares) + f" | {backlog}")
        stop.set()
        feeder.join()
    finally:
        c.close()
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
