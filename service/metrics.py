"""Prometheus metrics of the API: request timing, body limit, and model gauges read from Redis
at scrape time (bounded label sets: only models that exist)."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from workers.store import reads as store
from workers.store.keys import BLOCK_SECONDS_BUCKETS, Keys, parse_model_ref

HTTP_SECONDS = Histogram("sgais_http_request_seconds", "HTTP request latency (seconds)", ["method", "route", "status"])


class TimingMiddleware:
    """Observe ``sgais_http_request_seconds{method, route (template), status}`` (pure ASGI)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        code = [500]

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                code[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            HTTP_SECONDS.labels(scope["method"], template, str(code[0])).observe(time.perf_counter() - start)


class BodyLimitMiddleware:
    """Answer 413 to request bodies over ``max_bytes`` (Content-Length or counted while streaming)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):
        body = json.dumps({"detail": f"request body exceeds SGAIS_MAX_BODY_BYTES={self.max_bytes}"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["tenant", "stream", "model"])


async def redis_metrics(r: aioredis.Redis, keys: Keys, heartbeat_seconds: float) -> bytes:
    """Model gauges, alert counts, block latency histogram and worker leases, read from Redis now."""
    refs = sorted(await r.smembers(keys.models))
    pipe = r.pipeline(transaction=False)
    for ref in refs:
        tenant, m = parse_model_ref(ref)
        pipe.get(keys.model(tenant, m))
        pipe.hmget(keys.checkpoint(tenant, m), ["observations", "log_evidence", "chunks", "last_block"])
    got = await pipe.execute()
    g: dict[str, GaugeMetricFamily] = {
        "lz": _gauge("sgais_log_evidence", "running log-evidence (nats)"),
        "lzo": _gauge("sgais_log_evidence_per_observation", "log-evidence per observation (nats)"),
        "p": _gauge("sgais_model_probability", "posterior model probability on its stream"),
        "obs": _gauge("sgais_observations_processed", "observations absorbed by the model"),
        "pending": _gauge("sgais_chunks_pending", "chunks of the stream not yet absorbed by the model"),
        "steps": _gauge("sgais_annealing_steps", "annealing steps of the last block"),
        "ess": _gauge("sgais_ess", "ESS of the particles after the last block (particles)"),
        # issue 12: the change posterior of the last block (workers/segmented.py)
        "cp": _gauge("sgais_change_probability", "posterior probability of a change in the current segment"),
    }
    streams: dict[tuple[str, str], int] = {}
    for i, ref in enumerate(refs):
        tenant, m = parse_model_ref(ref)
        cfg_raw, (obs, lz, chunks, last) = got[2 * i], got[2 * i + 1]
        if cfg_raw is None:
            continue
        s = json.loads(cfg_raw)["stream"]
        if (tenant, s) not in streams:
            streams[(tenant, s)] = int(await r.hget(keys.meta(tenant, s), "chunks") or 0)
        labels = [tenant, s, m]
        obs_i, lz_f = int(obs or 0), float(lz or 0.0)
        g["lz"].add_metric(labels, lz_f)
        if obs_i:
            g["lzo"].add_metric(labels, lz_f / obs_i)
        g["obs"].add_metric(labels, obs_i)
        g["pending"].add_metric(labels, max(streams[(tenant, s)] - int(chunks or 0), 0))
        if last:
            block = json.loads(last)
            g["steps"].add_metric(labels, block["annealing_steps"])
            g["ess"].add_metric(labels, block["ess"])
            if block.get("change_probability") is not None:
                g["cp"].add_metric(labels, block["change_probability"])
    for tenant, s in streams:
        post = await store.stream_posterior(r, keys, tenant, s)
        for entry in post["models"]:
            g["p"].add_metric([tenant, s, entry["model"]], entry["probability"])
    alerts = CounterMetricFamily("sgais_alerts", "alerts raised", labels=["kind"])
    for kind, count in sorted((await r.hgetall(keys.alerts_total)).items()):
        alerts.add_metric([kind], float(count))
    hist = await r.hgetall(keys.block_seconds)
    cumulative, buckets = 0, []
    for le in BLOCK_SECONDS_BUCKETS:
        cumulative += int(hist.get(str(le), 0))
        buckets.append((str(le), cumulative))
    buckets.append(("+Inf", int(hist.get("count", 0))))
    block = HistogramMetricFamily(
        "sgais_block_seconds",
        "wall-clock seconds per absorbed block",
        buckets=buckets,
        sum_value=float(hist.get("sum", 0.0)),
    )
    leases = GaugeMetricFamily("sgais_worker_leases", "models leased by the worker", labels=["worker"])
    for wid in await r.zrangebyscore(keys.workers, time.time() - 3 * heartbeat_seconds, "+inf"):
        beat = await r.get(keys.worker(wid))
        if beat:
            leases.add_metric([wid], json.loads(beat)["leases"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static([*g.values(), alerts, block, leases]))
    return generate_latest(REGISTRY) + generate_latest(registry)


class _Static:
    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self):
        return iter(self.families)
