"""Worker memory without process noise: the soak's traffic driven through one step-driven ``Worker`` in-process.

The soak's 3 streams × 2 linear-regression models get a 50-row chunk per stream per round (a round is one
soak post interval, ~3 s of the soak); every ``--churn-every`` rounds a model on a fresh stream is created,
fed two chunks and deleted as in ``bench/soak.py``.  The API runs in the same process (``TestClient``, no
worker threads) and the worker is driven by ``heartbeat``/``scan``/``step`` (as tests/integration/helpers.py
``run_until_idle``).  Every 50 rounds it prints the process RSS, the tensor bytes the held engines hold
(:func:`soak.held_bytes`) and the number of live Python objects.

With ``--history-capacity`` the models' histories are bounded reservoirs, so the data a worker must hold
stops growing: any RSS growth left is a leak.

    python bench/worker_memory.py --rounds 3000 --history-capacity 4096 --redis-url redis://127.0.0.1:6390/2
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import uuid
from pathlib import Path

import psutil
import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

import models  # noqa: E402, F401  (first: sets MKL's strict reproducibility, models/__init__)
from service.app import create_app  # noqa: E402
from workers.config import Settings  # noqa: E402
from workers.worker import Worker  # noqa: E402


def run_until_idle(worker: Worker) -> None:
    """Heartbeat, lease scan, then steps until none works."""
    worker.heartbeat()
    worker.scan()
    while worker.step():
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--churn-every", type=int, default=20, help="rounds between churned models (0: none)")
    p.add_argument("--history-capacity", type=int, default=0, help="bounded history reservoirs (0: exact)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6390/2")
    args = p.parse_args()
    if args.history_capacity:
        for m in soak.MODELS.values():
            m["sampler"]["history_capacity"] = args.history_capacity
    prefix = f"wmem-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        redis_url=args.redis_url, key_prefix=prefix, lease_ttl_seconds=30.0, heartbeat_seconds=0.2, api_keys=""
    )
    proc = psutil.Process()
    torch.set_num_threads(1)
    try:
        with TestClient(create_app(settings, workers=0)) as api:
            for i in range(3):
                for name, m in soak.MODELS.items():
                    r = api.post("/v1/models", json={"name": f"s{i}-{name}", "stream": f"s{i}", **m})
                    assert r.status_code == 201, r.text
            worker = Worker(settings)
            for k in range(1, args.rounds + 1):
                for i in range(3):
                    assert api.post(f"/v1/streams/s{i}/chunks", json=soak.chunk(i, k, 50)).status_code == 202
                if args.churn_every and k % args.churn_every == 0:
                    name, stream = f"tmp-{k}", f"churn-{k}"
                    api.post("/v1/models", json={"name": name, "stream": stream, **soak.MODELS["lr-a"]})
                    for seq in (1, 2):
                        api.post(f"/v1/streams/{stream}/chunks", json=soak.chunk(99, seq, 50))
                    run_until_idle(worker)
                    if k % (2 * args.churn_every) == 0:
                        api.delete(f"/v1/models/{name}")
                    api.delete(f"/v1/streams/{stream}")
                run_until_idle(worker)
                if k % 50 == 0:
                    gc.collect()
                    held = [soak.held_bytes(h.engine) for h in worker.held.values() if h.engine is not None]
                    rec = {
                        "round": k,
                        "rss_mb": round(proc.memory_info().rss / 2**20, 2),
                        "held_allocated_mb": round(sum(h["allocated"] for h in held) / 2**20, 2),
                        "held_history_rows_mb": round(sum(h["history_rows"] for h in held) / 2**20, 2),
                        "models_held": len(held),
                        "challengers": sum(h["challengers"] for h in held),
                        "python_objects": len(gc.get_objects()),
                    }
                    print(json.dumps(rec), flush=True)
    finally:
        r = redis.Redis.from_url(args.redis_url)
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i : i + 1000])


if __name__ == "__main__":
    main()
