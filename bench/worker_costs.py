"""Where the worker's CPU goes per model-block outside the engine, measured in process (issue 9, acceptance 1).

    python bench/worker_costs.py [--models 128] [--warm 100] [--chunks 20] [--per-chunk] [--restore] [--redis-url URL]

The models and data of ``bench/many_models.py --part gmm`` (one-component gmm models, one stream, 5-value
chunks, change-point challengers on), registered and posted through the API app in this process (no HTTP
server); one ``workers.worker.Worker`` stepped until idle.  ``--warm`` chunks are absorbed untimed, then the
``--chunks`` are posted and absorbed: all posted first (the worker reads them in one batch, as it does when
the stream runs ahead of it: checkpoint states deferred to the batch's last chunk), or with ``--per-chunk``
one pass per chunk (a state stored with every chunk).

The collector runs with the worker process's settings (:func:`workers.runner.quiet_gc`; without them it took about
a quarter of the time, session 24).  Prints the worker thread's CPU per model-block (``time.thread_time``: the API's
posting is not counted), in ``workers.segmented.advance_blocks`` (the engine) and outside it, then the CPU of the
main bookkeeping steps (each wrapped, so about 1 µs a call is the wrapper's), per model-block, with their wall
time (more than the CPU where the worker waits: for Redis to run its commit scripts, say), and the CPU of the worker's
first scan per model (leasing and creating the registered models).  With ``--restore``
the worker then dies (its leases and heartbeat dropped, nothing flushed) and a new one restores every model: the new
worker's CPU per model, and how many committed chunks each had to re-absorb since its stored state (a failover's
cost, ``workers.worker.loop.Worker.state_due``).  Runs against any
code base with the same worker API (``PYTHONPATH``), so two can be compared alternately on a noisy machine.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import torch
from fastapi.testclient import TestClient
from many_models import gmm_chunks, gmm_model

import workers.worker.loop as loop
from models.gmm import GaussianMixture
from service.app import create_app
from workers.config import Settings
from workers.quarantine import Attempts
from workers.runner import quiet_gc
from workers.segmented import SegmentedEngine
from workers.store import records
from workers.store.commit import Scripts
from workers.worker import Worker
from workers.worker.posterior import StreamPosteriors

CPU: Counter[str] = Counter()
WALL: Counter[str] = Counter()


def timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its thread CPU seconds to ``CPU[label]`` and its wall seconds to
    ``WALL[label]`` (more than the CPU where the worker waits, e.g. for Redis to run its scripts)."""
    fn: Callable[..., Any] | None = getattr(owner, name, None)
    if fn is None:  # an older code base without this step
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, w0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CPU[label] += time.thread_time() - t0
            WALL[label] += time.perf_counter() - w0

    setattr(owner, name, wrapper)


STEPS = [
    (loop, "advance_blocks", "engine: advance_blocks"),
    (Worker, "finish_all", "finish_all (alerts, commits, posterior)"),
    (Worker, "send_round", "send_round (alerts, commits staged and sent)"),
    (Worker, "settle_round", "settle_round (commit replies, posterior)"),
    (Worker, "commit_call", "  commit_call (checkpoint, events)"),
    (SegmentedEngine, "to_bytes", "    engine to_bytes"),
    (SegmentedEngine, "changepoint_bytes", "    engine changepoint_bytes"),
    (records, "evidence_event_head", "    evidence_event_head"),
    (Scripts, "commit_many", "  commit_many (Redis)"),
    (Attempts, "begin_many", "begin_many (attempts counted, Redis)"),
    (Scripts, "send_commits", "  send_commits (packed and written)"),
    (Scripts, "commit_replies", "  commit_replies (read: Redis's wait)"),
    (loop.detect, "detect", "  detect (alerts)"),
    (StreamPosteriors, "compute", "  stream posterior compute"),
    (Scripts, "set_leader", "  stream posterior set_leader"),
    (records, "decode_chunk", "decode_chunk"),
    (GaussianMixture, "validate", "validate"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=128)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--per-chunk", action="store_true", help="one worker pass per posted chunk")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    ap.add_argument(
        "--restore",
        action="store_true",
        help="then the worker dies (its leases and heartbeat dropped) and a new one restores every model: its CPU",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    for owner, name, label in STEPS:
        timed(owner, name, label)
    settings = Settings(redis_url=args.redis_url, key_prefix=f"worker-costs-{uuid.uuid4().hex[:8]}", api_keys="")
    data = gmm_chunks(args.warm + args.chunks)
    step_cpu = step_wall = restore_cpu = load_cpu = 0.0
    steps: dict[str, float] = {}
    walls: dict[str, float] = {}
    unsaved: list[int] = []
    try:
        with TestClient(create_app(settings, workers=0)) as c:
            for i in range(args.models):
                c.post("/v1/models", json={"name": f"m{i}", "stream": "s", **gmm_model(i)}).raise_for_status()
            worker = Worker(settings)
            quiet_gc()  # the worker process's collector settings (workers.runner.main), after the Worker as there
            worker.heartbeat()
            t0 = time.thread_time()
            worker.scan()  # leases and creates every model (their initial checkpoints committed)
            load_cpu = time.thread_time() - t0
            assert len(worker.leases.snapshot()) == args.models

            def feed(chunks: list[dict], per_chunk: bool) -> tuple[float, float]:
                cpu = wall = 0.0
                for i, body in enumerate(chunks):
                    c.post("/v1/streams/s/chunks", json=body).raise_for_status()
                    if per_chunk or i == len(chunks) - 1:
                        t0, w0 = time.thread_time(), time.perf_counter()
                        while worker.step():
                            pass
                        cpu += time.thread_time() - t0
                        wall += time.perf_counter() - w0
                return cpu, wall

            feed(data[: args.warm], args.per_chunk)
            CPU.clear()
            WALL.clear()
            step_cpu, step_wall = feed(data[args.warm :], args.per_chunk)
            steps, walls = dict(CPU), dict(WALL)  # the timed chunks' (a restore's re-absorbing adds to CPU)
            if args.restore:
                unsaved = [h.unsaved for h in worker.leases.snapshot()]
                for h in worker.leases.snapshot():  # the worker dies: its leases and heartbeat expire
                    worker.r.delete(worker.keys.lease(h.tenant, h.name))
                worker.r.delete(worker.keys.worker(worker.id))
                worker.r.zrem(worker.keys.workers, worker.id)
                second = Worker(settings)
                second.heartbeat()
                t0 = time.thread_time()
                second.scan()
                while second.step():
                    pass
                restore_cpu = time.thread_time() - t0
                assert len(second.leases.snapshot()) == args.models
    finally:
        r = redis.Redis.from_url(args.redis_url)
        keys = list(r.scan_iter(match=f"{settings.key_prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    n = args.models * args.chunks
    engine = steps["engine: advance_blocks"]
    mode = "per chunk" if args.per_chunk else "batched"
    print(
        f"{args.models} models, {args.chunks} chunks after {args.warm} ({mode}): "
        f"worker CPU {1000 * step_cpu / n:.3f} ms per model-block, engine {1000 * engine / n:.3f}, "
        f"outside {1000 * (step_cpu - engine) / n:.3f}; wall {1000 * step_wall / n:.3f}"
    )
    for _, _, label in STEPS[1:]:
        if label in steps:
            print(f"  {label:44s} {1e6 * steps[label] / n:7.1f} us CPU {1e6 * walls[label] / n:7.1f} us wall")
    print(
        f"the worker's first scan (leases and creates every model): {1000 * load_cpu / args.models:.2f} ms of CPU "
        "per model"
    )
    if args.restore:
        print(
            f"restore by a new worker: {1000 * restore_cpu / args.models:.2f} ms of CPU per model; chunks committed "
            f"since the stored state: mean {sum(unsaved) / len(unsaved):.1f}, largest {max(unsaved)}"
        )


if __name__ == "__main__":
    main()
