"""Everything a worker writes for a fixed input, dumped to compare two code bases byte for byte.

    python bench/worker_identity.py --out A.txt [--changepoints on|off] [--redis-url redis://127.0.0.1:6379/13]
    PYTHONPATH=/path/to/other/tree python bench/worker_identity.py --out B.txt ... && cmp A.txt B.txt

14 models on 3 streams, registered through the API app in this process (no HTTP server): 5 one-component gmm
models and an AR(1) model on stream ``g`` (two layouts of one stream), 4 AR models of orders 1 and 2 on ``a``,
4 linear regressions on ``r`` (one on a subset of the stream's 2 columns).  The streams shift their mean by 2.5
after 70 values (change points, evidence drops, model switches).  With ``--changepoints on`` every model runs
its change-point challengers but two (``g1``, ``a7``); ``off``: none does.  Chunks of 5 values are posted in a
fixed pattern (1 to 5 chunks per stream between passes: a worker batch holds several chunks, so checkpoint
states are deferred) and one ``workers.worker.Worker`` is stepped until idle after each posting.

Output, one line each: every key under the run's prefix (strings, hashes and sets sorted, sorted sets in score
order, stream entries) and every event published on the streams' channels, in order.  The block timings in
the trace rows, events and the latency histogram come from a counter instead of the clock (the worker loop's
``time.perf_counter``), so they are part of the comparison; what is random or time-based is normalised: stream
entry ids (to ordinals), alert ids and creation times (and the alerts' sorted-set scores), the quarantine
record's attempt id, start time and config fingerprint (the config holds its creation time); leases, worker
heartbeats and the lease shares' measured loads (``costs``, ``loads``: engine seconds per wall second) are left
out.  Two runs of one code base give the same file.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import redis
import torch
from fastapi.testclient import TestClient

import workers.worker.loop as loop
from service.app import create_app
from workers.config import Settings
from workers.worker import Worker

PREFIX = "identity"
STREAMS = ("g", "a", "r")
PATTERN = [1, 1, 3, 1, 2, 4, 1, 1, 5, 1, 2, 1, 1, 3, 1, 1]  # chunks posted per stream before the worker runs


class CounterClock:
    """The worker loop's ``time`` module with ``perf_counter`` counting 1/1024 s per call (exact in binary)."""

    def __init__(self) -> None:
        self.calls = 0

    def perf_counter(self) -> float:
        self.calls += 1
        return self.calls / 1024

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def models(changepoints: bool) -> list[tuple[str, dict]]:
    """(stream, model body) of the 14 models, in registration order (model ``j`` is named stream + ``j``)."""
    out: list[tuple[str, dict]] = []

    def add(stream: str, body: dict) -> None:
        if not changepoints or len(out) in (1, 7):
            body["alerts"] = {"change_point": {"enabled": False}}
        out.append((stream, body))

    for i in range(5):
        params = {"dim": 1, "components": 1, "variance_shape": 1.0 + 0.5 * i, "mean_scale": 1.0 + i}
        add("g", {"family": "gmm", "params": params, "sampler": {"seed": i}})
    add("g", {"family": "autoregressive", "params": {"order": 1}, "sampler": {"seed": 50}})
    for i in range(4):
        add("a", {"family": "autoregressive", "params": {"order": 1 + i % 2}, "sampler": {"seed": 10 + i}})
    for i in range(4):
        params = {"features": [0], "columns": 2} if i == 3 else {"features": 2}
        add("r", {"family": "linear_regression", "params": params, "sampler": {"seed": 20 + i}})
    return out


def chunk(g: torch.Generator, stream: str, k: int) -> dict:
    """Chunk ``k`` of ``stream``: 5 values, the mean shifted by 2.5 from chunk 14 on."""
    shift = 2.5 if k >= 14 else 0.0
    e = torch.randn(5, generator=g, dtype=torch.float64)
    if stream == "r":
        x = torch.randn(5, 2, generator=g, dtype=torch.float64)
        y = x @ torch.tensor([0.7, -0.4], dtype=torch.float64) + 0.2 + shift + 0.5 * e
        return {"x": x.tolist(), "y": y.tolist()}
    return {"y": (0.3 + shift + e).tolist()}


def run(url: str, changepoints: bool) -> list[tuple[str, str]]:
    """Register, post and absorb; the events published, ``(channel, data)`` in order."""
    settings = Settings(redis_url=url, key_prefix=PREFIX, api_keys="", read_batch=4, checkpoint_every=3)
    r = redis.Redis.from_url(url)
    events: list[tuple[str, str]] = []
    g = torch.Generator().manual_seed(7)
    with TestClient(create_app(settings, workers=0)) as c:
        pubsub = r.pubsub()
        pubsub.psubscribe(f"{PREFIX}:*")
        for j, (stream, body) in enumerate(models(changepoints)):
            c.post("/v1/models", json={"name": f"{stream}{j}", "stream": stream, **body}).raise_for_status()
        worker = Worker(settings, worker_id="identity-worker")
        worker.heartbeat()
        worker.scan()
        k = 0
        for n in PATTERN:
            for _ in range(n):
                for stream in STREAMS:
                    c.post(f"/v1/streams/{stream}/chunks", json=chunk(g, stream, k)).raise_for_status()
                k += 1
            while worker.step():
                pass
            while (m := pubsub.get_message(timeout=0.05)) is not None:
                if m["type"] == "pmessage":
                    events.append((m["channel"].decode(), m["data"].decode()))
    return events


def dump(r: redis.Redis, events: list[tuple[str, str]]) -> list[str]:
    """The normalised lines (module docstring)."""
    ids = {}
    for stream in STREAMS:
        for i, (eid, _) in enumerate(r.xrange(f"{PREFIX}:default:stream:{stream}")):
            ids[eid.decode()] = f"E{stream}{i}"

    def norm(text: str) -> str:
        text = re.sub(r"\d{13}-\d+", lambda m: ids.get(m.group(0), "E?"), text)
        text = re.sub(r'"id": "[0-9a-f]{16}"', '"id": "X"', text)
        return re.sub(r'"created_at": "[^"]+"', '"created_at": "X"', text)

    def text(v: Any) -> str:
        return norm(v.decode("latin-1") if isinstance(v, bytes) else str(v))

    lines = []
    for key in sorted(k.decode() for k in r.scan_iter(match=f"{PREFIX}:*", count=1000)):
        if ":lease:" in key or ":worker" in key or key in (f"{PREFIX}:costs", f"{PREFIX}:loads"):
            continue  # the lease shares' measured loads (workers.worker.leases) are wall-clock rates
        kind = r.type(key).decode()
        value: Any = kind
        if kind == "string":
            value = text(r.get(key))
        elif kind == "hash":
            value = sorted((text(f), text(x)) for f, x in r.hgetall(key).items())
            if ":attempts:" in key:
                value = [(f, "X" if f in ("id", "started_at", "model") else x) for f, x in value]
        elif kind == "set":
            value = sorted(text(m) for m in r.smembers(key))
        elif kind == "zset":
            scored = [(text(m), s) for m, s in r.zrange(key, 0, -1, withscores=True)]
            value = sorted((m, "X") for m, _ in scored) if key.endswith(":alerts") else scored
        elif kind == "stream":
            value = [(text(e), sorted((text(f), text(x)) for f, x in fl.items())) for e, fl in r.xrange(key)]
        lines.append(f"{norm(key)}\t{json.dumps(value)}")
    lines += [f"EVENT {norm(channel)}\t{norm(data)}" for channel, data in events]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--changepoints", choices=["on", "off"], default="on")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = ap.parse_args()
    torch.set_num_threads(1)
    loop.time = CounterClock()  # type: ignore[assignment]
    r = redis.Redis.from_url(args.redis_url)
    stale = list(r.scan_iter(match=f"{PREFIX}:*", count=1000))
    if stale:
        r.delete(*stale)
    try:
        lines = dump(r, run(args.redis_url, args.changepoints == "on"))
    finally:
        stale = list(r.scan_iter(match=f"{PREFIX}:*", count=1000))
        if stale:
            r.delete(*stale)
    Path(args.out).write_text("\n".join(lines) + "\n")
    keys = sum(not line.startswith("EVENT ") for line in lines)
    print(f"{keys} keys ({sum(':ckpt:' in line.split(chr(9))[0] for line in lines)} checkpoints), "
          f"{len(lines) - keys} events -> {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
