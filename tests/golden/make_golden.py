"""Golden outputs: trace rows and checkpoint hashes for fixed seeds, every family, recorded once and
compared bit for bit by ``tests/test_golden.py``.

Two kinds of record, one JSON file each under ``tests/data/golden/``, each with the machine kind it was
recorded on (bit for bit there, to a tight tolerance elsewhere: :mod:`tests.golden.compare`):

- ``engine.json``: per case (every family, small sizes), the :class:`workers.sgais.BlockInfo` fields of
  every block that :class:`workers.engine.ModelEngine` produces on fixed chunks, and the sha256 of the
  checkpoint bytes (``to_bytes()``) and the sum of each of its tensors after each chunk;
- ``worker.json``: one end-to-end run through the worker (a real Redis): models created through the API,
  chunks posted, one :class:`workers.worker.Worker` stepped until idle, and the trace rows as stored (every
  field but ``seconds``, a wall-clock time).

Re-record after an intended change of the numerics (one command, a real Redis needed for the worker run)::

    SGAIS_TEST_REDIS_URL=redis://127.0.0.1:6379/2 python -m tests.golden.make_golden

and commit the JSON files with the change that moved them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load

from tests.golden.compare import machine

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
D64 = torch.float64

SAMPLER = {"particles": 12, "burn_in": 4, "block_size": 25, "seed": 11}
# (case name, family, params, sampler overrides); the last linear case re-anneals (warm-up 50, then at each doubling)
ENGINE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("linear_regression", "linear_regression", {"features": 2}, {}),
    (
        "linear_regression-reanneal",
        "linear_regression",
        {"features": 2},
        {"warmup_observations": 50, "reanneal_steps": 1},
    ),
    ("logistic_regression", "logistic_regression", {"features": 2, "classes": 3}, {}),
    ("gmm-1d", "gmm", {"dim": 1, "components": 2}, {}),
    ("gmm-2d", "gmm", {"dim": 2, "components": 2}, {"warmup_particles": 20, "warmup_observations": 50}),
    ("gmm-1component", "gmm", {"dim": 2, "components": 1}, {}),  # the warm-up's exact draws (workers.sgais.exact_draw)
    ("autoregressive", "autoregressive", {"order": 2}, {}),
    ("bnn", "bnn", {"features": 2, "hidden": [3], "outputs": 1}, {}),
]
CHUNKS, CHUNK_ROWS = 3, 40  # two blocks per chunk (25 + 15)


def chunk_data(family: str, params: dict[str, Any], n: int, g: torch.Generator) -> tuple[Any, Any]:
    """One chunk of ``n`` stream values for ``family`` as JSON-able lists ``(x or None, y)``."""
    if family == "gmm":
        y = torch.randn(n, params["dim"], generator=g, dtype=D64) * 2 + 1
        return None, (y.tolist() if params["dim"] > 1 else y[:, 0].tolist())
    if family == "autoregressive":
        return None, torch.randn(n, generator=g, dtype=D64).tolist()
    x = torch.randn(n, params["features"], generator=g, dtype=D64)
    if family == "logistic_regression":
        return x.tolist(), torch.randint(0, params["classes"], (n,), generator=g).tolist()
    w = torch.arange(1, params["features"] + 1, dtype=D64)
    return x.tolist(), (x @ w + 0.5 + torch.randn(n, generator=g, dtype=D64)).tolist()


def case_chunks(family: str, params: dict[str, Any]) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(7)
    return [chunk_data(family, params, CHUNK_ROWS, g) for _ in range(CHUNKS)]


def engine_record(family: str, params: dict[str, Any], sampler: dict[str, Any]) -> dict[str, Any]:
    """Block diagnostics and checkpoint hashes of a bare engine on :func:`case_chunks`."""
    from workers.engine import ModelEngine

    eng = ModelEngine(family, params, {**SAMPLER, **sampler})
    blocks, hashes, sums = [], [], []
    for x, y in case_chunks(family, params):
        blocks += [info._asdict() for info in eng.update(x, y)]
        data = eng.to_bytes()
        hashes.append(hashlib.sha256(data).hexdigest())
        sums.append({name: float(t.to(torch.float64).sum()) for name, t in sorted(st_load(data).items())})
    return {
        "family": family,
        "params": params,
        "sampler": {**SAMPLER, **sampler},
        "blocks": blocks,
        "sha256": hashes,
        "checkpoint_sums": sums,
    }


def engine_golden() -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine()}  # the machine kind the bits were recorded on
    return out | {name: engine_record(family, params, sampler) for name, family, params, sampler in ENGINE_CASES}


WORKER_MODELS = {
    "lin": {"family": "linear_regression", "params": {"features": 2}, "sampler": {**SAMPLER, "seed": 3}},
    "lin-wide": {
        "family": "linear_regression",
        "params": {"features": 2, "noise_std": 3.0},
        "sampler": {**SAMPLER, "seed": 4},
    },
}


def worker_golden(redis_url: str) -> dict[str, Any]:
    """Two models on one stream, three chunks, one worker stepped until idle: the stored trace rows."""
    import redis
    from fastapi.testclient import TestClient

    from service.app import create_app
    from workers.config import Settings
    from workers.store.keys import Keys
    from workers.worker import Worker

    prefix = f"sgais-golden-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_url, key_prefix=prefix, api_keys="", lease_ttl_seconds=30.0, worker_id="golden")
    r = redis.Redis.from_url(redis_url)
    try:
        with TestClient(create_app(settings, workers=0)) as c:
            for name, model in WORKER_MODELS.items():
                assert c.post("/v1/models", json={"name": name, "stream": "s", **model}).status_code == 201
            for i, (x, y) in enumerate(case_chunks("linear_regression", {"features": 2})):
                assert c.post("/v1/streams/s/chunks", json={"seq": i + 1, "x": x, "y": y}).status_code == 202
            pubsub = r.pubsub()
            pubsub.subscribe(Keys(prefix).events("default", "s"))
            worker = Worker(settings)
            try:
                worker.heartbeat()
                worker.scan()
                while worker.step():
                    pass
            finally:
                worker.shutdown()
            traces = {
                name: c.get(f"/v1/models/{name}/trace", params={"limit": 10000}).json()["items"]
                for name in WORKER_MODELS
            }
            posterior = c.get("/v1/streams/s/posterior").json()
            events = []
            while (msg := pubsub.get_message(timeout=1.0)) is not None:
                if msg["type"] == "message":
                    events.append(_without_clock(json.loads(msg["data"])))
            pubsub.close()
    finally:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
    traces = {name: [_without_clock(row) for row in rows] for name, rows in traces.items()}
    return {"models": WORKER_MODELS, "traces": traces, "posterior": posterior, "events": events, "machine": machine()}


def _without_clock(body: Any) -> Any:
    """``body`` without its wall-clock fields (``seconds``, ``created_at``) and random alert ids."""
    if isinstance(body, dict):
        return {k: _without_clock(v) for k, v in body.items() if k not in ("seconds", "created_at", "id")}
    if isinstance(body, list):
        return [_without_clock(v) for v in body]
    return body


def write(name: str, data: dict[str, Any]) -> Path:
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    path = GOLDEN_DIR / name
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def main() -> None:
    torch.set_num_threads(1)  # as the workers and the tests (reductions may round differently otherwise)
    url = os.environ.get("SGAIS_TEST_REDIS_URL")
    if not url:
        sys.exit("SGAIS_TEST_REDIS_URL is required (the worker run needs a real Redis)")
    print(write("engine.json", engine_golden()))
    print(write("worker.json", worker_golden(url)))


if __name__ == "__main__":
    main()
