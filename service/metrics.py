"""Prometheus metrics of the API: request timing, body limit, and model gauges read from Redis
at scrape time.

Label sets stay bounded: a series exists only for a model (or stream) that exists now, so the series
of a deleted model disappear with it; statuses and alert kinds are closed sets.  A scrape costs three
pipelined Redis round trips whatever the number of models (``bench/metrics_scrape.py``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from workers.store import records
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


MODEL_LABELS = ["tenant", "stream", "model"]
STATUSES = ("pending", "ok", "degraded", "error")  # the evidence resource's ``status`` (API.md)
_CKPT = ["observations", "log_evidence", "chunks", "last_block", "status"]


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=MODEL_LABELS)


async def redis_metrics(r: aioredis.Redis, keys: Keys, heartbeat_seconds: float, *, labelled: bool = True) -> bytes:
    """Model gauges, model status, alert counts, block latency histogram and worker leases, read from Redis now.

    With ``labelled`` False (a scrape without the metrics key while API keys are configured) only
    aggregates that name no tenant, stream or model are exported: models by status, alerts by kind,
    the block latency histogram, worker leases and the API's own request metrics.

    Three round trips: the model set; every config and checkpoint plus the global hashes; every stream's
    chunk count, each active model's trace row at its stream's common count, the tenants' alert
    counts by stream and the worker heartbeats.
    """
    refs = sorted(await r.smembers(keys.models))
    parsed = [parse_model_ref(ref) for ref in refs]
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for tenant, m in parsed:
        pipe.get(keys.model(tenant, m))
        pipe.hmget(keys.checkpoint(tenant, m), _CKPT)
    pipe.hgetall(keys.alerts_total)
    pipe.hgetall(keys.block_seconds)
    pipe.zrangebyscore(keys.workers, now - 3 * heartbeat_seconds, "+inf")
    got = await pipe.execute()
    alerts_by_kind, hist, worker_ids = got[-3:]

    models, streams = _models(parsed, got)
    # the stream posterior (workers/store/reads.stream_posterior) of every stream, batched
    counts = {
        key: records.common_count({e["model"]: {"observations": e["observations"], "status": e["status"]} for e in ms})
        for key, ms in streams.items()
    }
    # the trace rows are read only for a labelled scrape (probabilities are per model)
    active = [(key, e) for key, ms in streams.items() for e in ms if e["status"] != "error"] if labelled else []
    tenants = sorted({t for t, _ in streams})
    pipe = r.pipeline(transaction=False)
    for tenant, s in streams:
        pipe.hget(keys.meta(tenant, s), "chunks")
    for (tenant, _), e in active:
        if counts[(tenant, e["stream"])] > 0:
            pipe.zrevrangebyscore(keys.trace(tenant, e["model"]), counts[(tenant, e["stream"])] - 1, "-inf", 0, 1)
    for tenant in tenants if labelled else []:
        pipe.hgetall(keys.alerts_by_stream(tenant))
    for wid in worker_ids:
        pipe.get(keys.worker(wid))
    got2 = iter(await pipe.execute())
    stream_chunks = {key: int(next(got2) or 0) for key in streams}
    entries: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in streams}
    for key, e in active:
        count = counts[key]
        if count == 0:
            entries[key].append({"model": e["model"], "prior_probability": e["prior"], "log_evidence": 0.0})
            continue
        row = records.trace_row_at(next(got2), count)
        if row is not None:
            entries[key].append(
                {"model": e["model"], "prior_probability": e["prior"], "log_evidence": row["log_evidence"]}
            )
    by_stream = {tenant: next(got2) for tenant in (tenants if labelled else [])}
    beats = [next(got2) for _ in worker_ids]

    families: list[Any] = []
    by_status = GaugeMetricFamily("sgais_models", "models by status (pending, ok, degraded, error)", labels=["status"])
    for st in STATUSES:
        by_status.add_metric([st], sum(1 for e in models if e["status"] == st))
    families.append(by_status)
    if labelled:
        families += _model_families(models, streams, stream_chunks, counts, entries)
        families.append(_stream_alerts(by_stream, streams))
    families += _aggregate_families(alerts_by_kind, hist, worker_ids, beats)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(families))
    return generate_latest(REGISTRY) + generate_latest(registry)


def _models(
    parsed: list[tuple[str, str]], got: list[Any]
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[dict[str, Any]]]]:
    """One dict per existing model (labels, prior, checkpoint fields, status) and the models by ``(tenant, stream)``."""
    models: list[dict[str, Any]] = []
    streams: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i, (tenant, m) in enumerate(parsed):
        cfg_raw, (obs, lz, chunks, last, st) = got[2 * i], got[2 * i + 1]
        if cfg_raw is None:  # deleted between SMEMBERS and GET
            continue
        cfg = json.loads(cfg_raw)
        entry = {
            "tenant": tenant,
            "stream": cfg["stream"],
            "model": m,
            "prior": cfg.get("prior_probability", 1.0),
            "observations": int(obs or 0),
            "log_evidence": float(lz or 0.0),
            "chunks": int(chunks or 0),
            "last": last,
            "status": "pending" if chunks is None else (st or "ok"),
        }
        models.append(entry)
        streams.setdefault((tenant, cfg["stream"]), []).append(entry)
    return models, streams


def _model_families(
    models: list[dict[str, Any]],
    streams: dict[tuple[str, str], list[dict[str, Any]]],
    stream_chunks: dict[tuple[str, str], int],
    counts: dict[tuple[str, str], int],
    entries: dict[tuple[str, str], list[dict[str, Any]]],
) -> list[GaugeMetricFamily]:
    """The per-model gauges (labels ``tenant, stream, model``), ``sgais_model_status`` one-hot over STATUSES."""
    g: dict[str, GaugeMetricFamily] = {
        "lz": _gauge("sgais_log_evidence", "running log-evidence (nats)"),
        "lzo": _gauge("sgais_log_evidence_per_observation", "log-evidence per observation (nats)"),
        "p": _gauge("sgais_model_probability", "posterior model probability on its stream"),
        "obs": _gauge("sgais_observations_processed", "observations absorbed by the model"),
        "pending": _gauge("sgais_chunks_pending", "chunks of the stream not yet absorbed by the model"),
        "steps": _gauge("sgais_annealing_steps", "annealing steps of the last block"),
        "ess": _gauge("sgais_ess", "ESS of the particles after the last block (particles)"),
    }
    status = GaugeMetricFamily(
        "sgais_model_status",
        "1 for the model's current status (pending, ok, degraded, error), 0 for the others",
        labels=[*MODEL_LABELS, "status"],
    )
    for e in models:
        labels = [e["tenant"], e["stream"], e["model"]]
        g["lz"].add_metric(labels, e["log_evidence"])
        if e["observations"]:
            g["lzo"].add_metric(labels, e["log_evidence"] / e["observations"])
        g["obs"].add_metric(labels, e["observations"])
        g["pending"].add_metric(labels, max(stream_chunks[(e["tenant"], e["stream"])] - e["chunks"], 0))
        if e["last"]:
            block = json.loads(e["last"])
            g["steps"].add_metric(labels, block["annealing_steps"])
            g["ess"].add_metric(labels, block["ess"])
        for st in STATUSES:
            status.add_metric([*labels, st], 1.0 if e["status"] == st else 0.0)
    for tenant, s in streams:
        post = records.stream_posterior(s, counts[(tenant, s)], entries[(tenant, s)])
        for entry in post["models"]:
            if entry.get("probability") is not None:
                g["p"].add_metric([tenant, s, entry["model"]], entry["probability"])
    return [*g.values(), status]


def _stream_alerts(
    by_stream: dict[str, dict[str, str]], streams: dict[tuple[str, str], list[dict[str, Any]]]
) -> CounterMetricFamily:
    """``sgais_stream_alerts_total{tenant, stream, kind}`` from the tenants' ``stream/kind`` counts; only streams
    that have models now (a stream whose models were all deleted has no series)."""
    stream_alerts = CounterMetricFamily(
        "sgais_stream_alerts", "alerts raised on a stream, by kind", labels=["tenant", "stream", "kind"]
    )
    for tenant, counts in sorted(by_stream.items()):
        for field, count in sorted(counts.items()):
            s, _, kind = field.rpartition("/")
            if (tenant, s) in streams:
                stream_alerts.add_metric([tenant, s, kind], float(count))
    return stream_alerts


def _aggregate_families(
    alerts_by_kind: dict[str, str], hist: dict[str, str], worker_ids: list[str], beats: list[str | None]
) -> list[Any]:
    """Alerts by kind, the block latency histogram and the workers' leases (no tenant, stream or model)."""
    families: list[Any] = []
    alerts = CounterMetricFamily("sgais_alerts", "alerts raised", labels=["kind"])
    for kind, count in sorted(alerts_by_kind.items()):
        alerts.add_metric([kind], float(count))
    families.append(alerts)
    cumulative, buckets = 0, []
    for le in BLOCK_SECONDS_BUCKETS:
        cumulative += int(hist.get(str(le), 0))
        buckets.append((str(le), cumulative))
    buckets.append(("+Inf", int(hist.get("count", 0))))
    families.append(
        HistogramMetricFamily(
            "sgais_block_seconds",
            "wall-clock seconds per absorbed block",
            buckets=buckets,
            sum_value=float(hist.get("sum", 0.0)),
        )
    )
    leases = GaugeMetricFamily("sgais_worker_leases", "models leased by the worker", labels=["worker"])
    for wid, beat in zip(worker_ids, beats, strict=True):
        if beat:
            leases.add_metric([wid], json.loads(beat)["leases"])
    families.append(leases)
    return families


class _Static:
    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self):
        return iter(self.families)
