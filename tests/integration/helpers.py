"""Data and reference runs shared by the integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from fastapi.testclient import TestClient

from workers.segmented import SegmentedEngine
from workers.store import records
from workers.worker.blocks import absorb_chunk
from workers.worker.restore import changepoint_settings


def linear_chunks(n_chunks: int, size: int, seed: int = 0, features: int = 2) -> list[dict]:
    """``n_chunks`` chunks of ``size`` rows from ``y = x·w + 0.5 + N(0, 1)``, as JSON bodies."""
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(1, features + 1, dtype=torch.float64)
    out = []
    for i in range(n_chunks):
        x = torch.randn(size, features, generator=g, dtype=torch.float64)
        y = x @ w + 0.5 + torch.randn(size, generator=g, dtype=torch.float64)
        out.append({"seq": i + 1, "x": x.tolist(), "y": y.tolist()})
    return out


#: Every trace-row field but ``seconds`` (wall-clock time).
COMPARED = ("seq", "first_index", "block_observations", "observations", *records.BLOCK_FIELDS)


def reference_trace(model: dict, chunks: list[dict]) -> list[dict]:
    """The trace an uninterrupted engine produces on ``chunks``: the worker's engine (the model with its
    challengers, whose settings cut the stream's first block, :func:`workers.segmented.ramp_bounds`) and its path
    from a chunk to its trace rows (:func:`workers.worker.blocks.absorb_chunk`), without Redis."""
    eng = SegmentedEngine.create(model["family"], model["params"], model["sampler"], changepoint_settings(model))
    rows: list[dict] = []
    for chunk in chunks:
        first = rows[-1]["observations"] if rows else 0
        rows += [b.row for b in absorb_chunk(eng, chunk.get("x"), chunk["y"], seq=chunk["seq"], first_index=first)]
    return rows


def strip(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in COMPARED} for r in rows]


def start_worker(settings, lease_ttl: float = 1.0) -> subprocess.Popen:
    """A worker process (``python -m workers.runner``) on ``settings``' Redis and prefix, with a lease TTL
    of ``lease_ttl`` seconds, a 0.2 s heartbeat and a 0.1 s poll."""
    env = {
        **os.environ,
        "SGAIS_REDIS_URL": settings.redis_url,
        "SGAIS_KEY_PREFIX": settings.key_prefix,
        "SGAIS_LEASE_TTL_SECONDS": str(lease_ttl),
        "SGAIS_HEARTBEAT_SECONDS": "0.2",
        "SGAIS_POLL_SECONDS": "0.1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "workers.runner"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@contextmanager
def api_with_models(settings, models: dict[str, dict], stream: str = "s") -> Iterator[TestClient]:
    """A test client of an app without worker threads, with ``models`` (name -> config) created on ``stream``."""
    from service.app import create_app

    with TestClient(create_app(settings, workers=0)) as c:
        for name, model in models.items():
            assert c.post("/v1/models", json={"name": name, "stream": stream, **model}).status_code == 201
        yield c


def die(worker) -> None:
    """A step-driven worker dies, and time passes: its leases and its heartbeat expire.  Dropping only the leases
    left it live for ``3 * heartbeat_seconds`` in the fair share, so the next worker, at a share of half the
    models, restored some of them only (an intermittent failure on a fast machine)."""
    for h in worker.leases.snapshot():
        worker.r.delete(worker.keys.lease(h.tenant, h.name))
    worker.leases.clear()
    worker.r.delete(worker.keys.worker(worker.id))
    worker.r.zrem(worker.keys.workers, worker.id)


def run_until_idle(worker) -> None:
    """Drive a step-driven :class:`workers.worker.Worker`: heartbeat, lease scan, then steps until none works."""
    worker.heartbeat()
    worker.scan()
    while worker.step():
        pass
