"""What one commit costs the worker, measured in process: CPU and wall milliseconds and Redis round
trips per model-chunk for the engine update and for the commit that follows it.

The data, models and settings of ``bench/service_overhead.py`` (500-observation chunks, linear regression
d = 5, default sampler), posted through the API app in this process (no HTTP server), then absorbed
by one ``workers.worker.Worker`` driven step by step, so nothing else competes with it except the
Redis server.  Round trips are counted as calls of redis-py's ``send_packed_command`` (a pipeline
or a script call is one).  Runs against any code base with the same Worker API: its own copy
(``python <root>/bench/commit_cost.py``; the script puts its own checkout first on ``sys.path``, so ``PYTHONPATH``
does not choose the code base).

    python bench/commit_cost.py [--chunks 100] [--models 1 10] [--redis-url redis://127.0.0.1:6379]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import uuid
from pathlib import Path

import redis
import redis.connection
import torch
from fastapi.testclient import TestClient

# the repository's service/, no longer shadowed by bench/ (bench/service_overhead.py was bench/service.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.app import create_app  # noqa: E402
from workers.config import Settings  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402
from workers.worker import Worker  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_service", Path(__file__).resolve().parent / "service_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

ROUND_TRIPS = [0]
_send = redis.connection.AbstractConnection.send_packed_command


def _counting_send(self, command, check_health=True):
    ROUND_TRIPS[0] += 1
    return _send(self, command, check_health)


class Clock:
    """Accumulated CPU seconds, wall seconds, round trips and calls of one wrapped phase."""

    def __init__(self):
        self.cpu = self.wall = 0.0
        self.trips = self.calls = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            c0, t0, r0 = time.process_time(), time.perf_counter(), ROUND_TRIPS[0]
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu += time.process_time() - c0
                self.wall += time.perf_counter() - t0
                self.trips += ROUND_TRIPS[0] - r0
                self.calls += 1

        return timed


def run(url: str, chunks: list[dict], n_models: int) -> tuple[Clock, Clock, Clock]:
    settings = Settings(redis_url=url, key_prefix=f"commit-cost-{uuid.uuid4().hex[:8]}", api_keys="")
    with TestClient(create_app(settings, workers=0)) as c:
        for i in range(n_models):
            c.post("/v1/models", json={"name": f"m{i}", "stream": "s", **bench.model(i)}).raise_for_status()
        for chunk in chunks:
            c.post("/v1/streams/s/chunks", json=chunk).raise_for_status()
    engine, commit, absorb = Clock(), Clock(), Clock()
    worker = Worker(settings)
    worker.heartbeat()
    worker.scan()  # leases and initialises every model (not timed)
    update, original_commit, original_absorb = ModelEngine.update, worker.commit, worker.absorb
    ModelEngine.update = engine.wrap(update)
    worker.commit, worker.absorb = commit.wrap(original_commit), absorb.wrap(original_absorb)
    redis.connection.AbstractConnection.send_packed_command = _counting_send
    try:
        while worker.step():
            pass
    finally:
        ModelEngine.update = update
        redis.connection.AbstractConnection.send_packed_command = _send
        r = redis.Redis.from_url(url)
        keys = list(r.scan_iter(match=f"{settings.key_prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    assert commit.calls == n_models * len(chunks), (commit.calls, n_models * len(chunks))
    return engine, commit, absorb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--models", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    args = ap.parse_args()
    torch.set_num_threads(1)
    chunks = bench.make_chunks(args.chunks)
    print(
        f"{'models':>6} | {'engine cpu ms':>13} | {'commit cpu ms':>13} | {'commit wall ms':>14} | "
        f"{'round trips':>11} | {'other absorb cpu ms':>19}   (per model-chunk)"
    )
    for n_models in args.models:
        engine, commit, absorb = run(args.redis_url, chunks, n_models)
        n = commit.calls
        print(
            f"{n_models:>6} | {1000 * engine.cpu / n:13.3f} | {1000 * commit.cpu / n:13.3f} | "
            f"{1000 * commit.wall / n:14.3f} | {commit.trips / n:11.2f} | "
            f"{1000 * (absorb.cpu - engine.cpu - commit.cpu) / n:19.3f}"
        )


if __name__ == "__main__":
    main()
