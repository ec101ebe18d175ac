"""Wall-clock seconds of one ``/metrics`` scrape at many models (hardening review F11), against a real Redis.

Fills a fresh key prefix with ``--models`` models (``--per-stream`` per stream, each with a config, a
checkpoint hash, one trace row and one alert count) the way the service stores them, then times
``service.metrics.redis_metrics`` (this tree: three pipelined round trips) and the baseline, the
implementation of commit 24aa4ac (one round trip per stream plus two per stream posterior), in the same
run, and a full HTTP scrape through the ASGI app with the metrics key.  The prefix is deleted after.

    python bench/metrics_scrape.py --redis-url redis://127.0.0.1:6379/4 [--models 3000] [--per-stream 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import redis
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.app import create_app  # noqa: E402
from service.metrics import redis_metrics  # noqa: E402
from workers.config import Settings  # noqa: E402
from workers.store.keys import Keys, model_ref  # noqa: E402

BASELINE_COMMIT = "24aa4ac"


def baseline_module():
    """``service/metrics.py`` as of :data:`BASELINE_COMMIT`, imported from a temp file."""
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:service/metrics.py"], capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "metrics_baseline.py"
    path.write_text(src.replace('Histogram("sgais_http', 'Histogram("sgais_baseline_http'))
    spec = importlib.util.spec_from_file_location("metrics_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fill(r: redis.Redis, keys: Keys, tenant: str, n_models: int, per_stream: int) -> None:
    """``n_models`` processed models, ``per_stream`` to a stream, 1000 observations each."""
    pipe = r.pipeline(transaction=False)
    for i in range(n_models):
        m, s = f"m{i:05d}", f"s{i // per_stream:05d}"
        cfg = {"name": m, "stream": s, "family": "gmm", "params": {"dim": 1, "components": 2}, "prior_probability": 1.0}
        pipe.set(keys.model(tenant, m), json.dumps(cfg))
        pipe.sadd(keys.models, model_ref(tenant, m))
        pipe.sadd(keys.tenant_models(tenant), m)
        pipe.sadd(keys.stream_models(tenant, s), m)
        pipe.hset(keys.meta(tenant, s), mapping={"schema": "{}", "chunks": 2, "observations": 1000})
        block = {"annealing_steps": 3, "ess": 40.0}
        pipe.hset(
            keys.checkpoint(tenant, m),
            mapping={
                "chunks": 2,
                "observations": 1000,
                "log_evidence": -1400.0 - i % 7,
                "last_block": json.dumps(block),
                "status": "ok",
            },
        )
        pipe.zadd(keys.trace(tenant, m), {json.dumps({"observations": 1000, "log_evidence": -1400.0 - i % 7}): 500})
        pipe.hincrby(keys.alerts_by_stream(tenant), f"{s}/evidence_drop", 1)
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()


CPU: dict[str, list[float]] = {}


async def time_it(fn, repeats: int, name: str = "") -> list[float]:
    """Wall-clock seconds of ``repeats`` calls; this process's CPU seconds per call go to ``CPU[name]``
    (the machine may be shared: CPU seconds do not count time spent waiting for a core)."""
    out = []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        await fn()
        out.append(time.perf_counter() - t0)
        CPU.setdefault(name, []).append(time.process_time() - c0)
    return out


async def main(args) -> None:
    keys = Keys(f"sgais-bench-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(args.redis_url)
    fill(sync, keys, "default", args.models, args.per_stream)
    r = aioredis.Redis.from_url(args.redis_url, decode_responses=True)
    base = baseline_module()
    try:
        before = sync.info("commandstats").get("cmdstat_eval", {}).get("usec", 0)
        new = await time_it(lambda: redis_metrics(r, keys, 1.0), args.repeats, "new")
        redis_us = (sync.info("commandstats").get("cmdstat_eval", {}).get("usec", 0) - before) / args.repeats
        old = await time_it(lambda: base.redis_metrics(r, keys, 1.0), args.repeats, "old")
        settings = Settings(redis_url=args.redis_url, key_prefix=keys.prefix, api_keys="t=k", metrics_key="mk")
        app = create_app(settings, workers=0)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:

                async def scrape():
                    res = await c.get("/metrics", headers={"Authorization": "Bearer mk"})
                    assert res.status_code == 200 and "sgais_model_status" in res.text

                http = await time_it(scrape, args.repeats, "http")
        n_series = (await redis_metrics(r, keys, 1.0)).count(b"\n")
    finally:
        await r.aclose()
        for batch in _batches(sync.scan_iter(match=f"{keys.prefix}:*", count=5000), 5000):
            sync.delete(*batch)
    med = statistics.median
    print(f"{args.models} models, {args.per_stream} per stream, {n_series} lines, median of {args.repeats}:")
    print(
        f"  redis_metrics (this tree)         {med(new):.3f} s wall (max {max(new):.3f}), {med(CPU['new']):.3f} s CPU"
    )
    print(f"  ... of which Redis runs the scripts {redis_us / 1e6:.3f} s per scrape (INFO commandstats)")
    cpu_old = med(CPU["old"])
    print(
        f"  redis_metrics ({BASELINE_COMMIT}, baseline) {med(old):.3f} s wall (max {max(old):.3f}), {cpu_old:.3f} s CPU"
    )
    print(f"  speed-up (wall)                   {med(old) / med(new):.1f}x")
    cpu_http = med(CPU["http"])
    print(f"  HTTP scrape via ASGI, keyed       {med(http):.3f} s wall (max {max(http):.3f}), {cpu_http:.3f} s CPU")
    print(f"  load average during the run       {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")


def _batches(it, n):
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/4")
    p.add_argument("--models", type=int, default=3000)
    p.add_argument("--per-stream", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    asyncio.run(main(p.parse_args()))
