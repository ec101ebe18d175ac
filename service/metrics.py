"""Prometheus metrics of the API: request timing, body limit, and model gauges read from Redis
at scrape time.

Label sets stay bounded: a series exists only for a model (or stream) that exists now, so the series
of a deleted model disappear with it; statuses and alert kinds are closed sets.  A scrape costs three
pipelined Redis round trips whatever the number of models (``bench/metrics_scrape.py``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from workers import comparison
from workers.store import reads as store
from workers.store import records
from workers.store.keys import BLOCK_SECONDS_BUCKETS, Keys, parse_counter_field

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
ALERT_KINDS = (
    "change_point",
    "evidence_drop",
    "annealing_spike",
    "model_switch",
)  # API.md "Alerts"; others appear once raised


# Read-only scripts: one reply for what would be thousands of pipelined commands (redis-py spends about
# 100 µs of Python per pipelined command; bench/metrics_scrape.py).  Key names come from templates built
# by Keys (the placeholders are replaced by plain string functions, never as Lua patterns).
# ARGV: model key template, checkpoint key template.  Returns per model: tenant, model, stream, prior,
# observations, log_evidence, chunks, annealing steps and ESS of the last block, status ('' = absent), family,
# change probability of the last block, log-evidence SE, params (JSON).
_MODELS_LUA = """
local function key(tpl, t, m)
  local a, b = string.find(tpl, '\\1T', 1, true)
  local s = string.sub(tpl, 1, a - 1) .. t .. string.sub(tpl, b + 1)
  a, b = string.find(s, '\\1M', 1, true)
  return string.sub(s, 1, a - 1) .. m .. string.sub(s, b + 1)
end
local out = {}
for _, ref in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local slash = string.find(ref, '/', 1, true)
  local t, m = string.sub(ref, 1, slash - 1), string.sub(ref, slash + 1)
  local cfg = redis.call('GET', key(ARGV[1], t, m))
  if cfg then
    local c = cjson.decode(cfg)
    local ck = redis.call('HMGET', key(ARGV[2], t, m), 'observations', 'log_evidence', 'chunks', 'last_block', 'status',
      'log_evidence_se')
    local steps, ess, change = '', '', ''
    if ck[4] and ck[4] ~= '' then
      local last = cjson.decode(ck[4])
      steps, ess = tostring(last['annealing_steps']), tostring(last['ess'])
      if type(last['change_probability']) == 'number' then change = tostring(last['change_probability']) end
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = t, m, c['stream'], tostring(c['prior_probability'] or 1)
    out[n + 5], out[n + 6], out[n + 7] = ck[1] or '', ck[2] or '', ck[3] or ''
    out[n + 8], out[n + 9], out[n + 10], out[n + 11] = steps, ess, ck[5] or '', c['family'] or ''
    out[n + 12], out[n + 13], out[n + 14] = change, ck[6] or '', cjson.encode(c['params'] or {})
  end
end
return out
"""
# ARGV: n stream meta keys and the keys, then n (trace key, largest score) pairs.  Returns the streams'
# chunk counts, then per trace the last row scored at most the given score ('' = none).
_STREAMS_LUA = """
local out, at = {}, 1
for _ = 1, tonumber(ARGV[1]) do
  at = at + 1
  out[#out + 1] = redis.call('HGET', ARGV[at], 'chunks') or '0'
end
at = at + 1
for _ = 1, tonumber(ARGV[at]) do
  local row = redis.call('ZREVRANGEBYSCORE', ARGV[at + 1], ARGV[at + 2], '-inf', 'LIMIT', 0, 1)
  out[#out + 1] = row[1] or ''
  at = at + 2
end
return out
"""


async def redis_metrics(r: aioredis.Redis, keys: Keys, heartbeat_seconds: float, *, labelled: bool = True) -> bytes:
    """Model gauges, model status, alert counts, block latency histogram and worker leases, read from Redis now.

    With ``labelled`` False (a scrape without the metrics key while API keys are configured) only
    aggregates that name no tenant, stream or model are exported: models by status, alerts by kind,
    the block latency histogram, worker leases and the API's own request metrics.

    Two round trips whatever the number of models: every model's config and checkpoint fields (one
    script) with the global hashes; every stream's chunk count and each active model's trace row at
    its stream's common count (one script), the tenants' alert counts by stream and the worker
    heartbeats.  ``bench/metrics_scrape.py`` measures it.
    """
    now = time.time()
    pipe = r.pipeline(transaction=False)
    pipe.eval(_MODELS_LUA, 1, keys.models, keys.model("\1T", "\1M"), keys.checkpoint("\1T", "\1M"))
    pipe.hgetall(keys.alerts_total)
    pipe.hgetall(keys.block_seconds)
    pipe.zrangebyscore(keys.workers, now - 3 * heartbeat_seconds, "+inf")
    pipe.hgetall(keys.loads)
    flat, alerts_by_kind, hist, worker_ids, loads = await pipe.execute()
    models, streams = _models(flat)
    # the stream posterior (workers/store/reads.stream_posterior) of every stream, batched
    counts = {
        key: records.common_count({e["model"]: {"observations": e["observations"], "status": e["status"]} for e in ms})
        for key, ms in streams.items()
    }
    # the trace rows are read only for a labelled scrape (probabilities are per model)
    active = [(key, e) for key, ms in streams.items() for e in ms if e["status"] != "error"] if labelled else []
    reads = [e for key, e in active if counts[key] > 0]
    args: list[Any] = [len(streams), *(keys.meta(t, s) for t, s in streams), len(reads)]
    for e in reads:
        args += [keys.trace(e["tenant"], e["model"]), counts[(e["tenant"], e["stream"])] - 1]
    tenants = sorted({t for t, _ in streams}) if labelled else []
    pipe = r.pipeline(transaction=False)
    pipe.eval(_STREAMS_LUA, 0, *args)
    for tenant in tenants:
        pipe.hgetall(keys.alerts_by_stream(tenant))
    for wid in worker_ids:
        pipe.get(keys.worker(wid))
    got = await pipe.execute()
    out = iter(got[0])
    stream_chunks = {key: int(next(out)) for key in streams}
    entries: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in streams}
    for key, e in active:
        count = counts[key]
        if count == 0:
            row = None
        else:
            raw = next(out)
            row = records.trace_row_at([raw] if raw else [], count)
        entry = {"model": e["model"], "prior_probability": e["prior"], "status": e["status"], "error": None}
        entries[key].append({**entry, "row_n": row, "row_c": None})
    by_stream = dict(zip(tenants, got[1 : 1 + len(tenants)], strict=True))
    beats = got[1 + len(tenants) :]
    # model probabilities on the stream's aligned observations (API.md "Model comparison"): streams of i.i.d.
    # models are conditioned on nothing (batched above); a stream with a model that conditions on its first
    # values (workers.comparison.model_context > 0, e.g. autoregressive) is read like
    # GET /v1/streams/{stream}/posterior, a few round trips each
    posts: dict[tuple[str, str], dict[str, Any]] = {}
    for key in streams if labelled else []:
        if any(e["context"] > 0 for e in streams[key]):
            posts[key] = await store.stream_posterior(r, keys, *key)
        else:
            posts[key] = records.stream_posterior(key[1], counts[key], 0, entries[key])

    families: list[Any] = []
    text = b""
    by_status = GaugeMetricFamily("sgais_models", "models by status (pending, ok, degraded, error)", labels=["status"])
    for st in STATUSES:
        by_status.add_metric([st], sum(1 for e in models if e["status"] == st))
    families.append(by_status)
    if labelled:
        text = (_model_families(models, stream_chunks, posts) + _stream_alerts(by_stream, streams)).encode()
        families += [
            await _worker_model_counter(r, keys.lease_losses, "sgais_lease_losses", "leases a worker lost on a model"),
            await _worker_model_counter(
                r, keys.retried_blocks, "sgais_retried_blocks", "blocks computed, refused by the lease fence and redone"
            ),
        ]
    families += _aggregate_families(alerts_by_kind, hist, worker_ids, beats, loads)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(families))
    return generate_latest(REGISTRY) + generate_latest(registry) + text


def _models(flat: list[str]) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[dict[str, Any]]]]:
    """The reply of :data:`_MODELS_LUA` -> one dict per model (labels, prior, checkpoint fields, status) and the
    models by ``(tenant, stream)``, in name order."""
    models: list[dict[str, Any]] = []
    streams: dict[tuple[str, str], list[dict[str, Any]]] = {}
    rows = sorted(tuple(flat[i : i + 14]) for i in range(0, len(flat), 14))
    for tenant, m, stream, prior, obs, lz, chunks, steps, ess, st, family, change, lz_se, params in rows:
        entry = {
            "tenant": tenant,
            "stream": stream,
            "model": m,
            "prior": float(prior),
            "observations": int(obs or 0),
            "log_evidence": float(lz or 0.0),
            "log_evidence_se": float(lz_se) if lz_se else None,
            "chunks": int(chunks or 0),
            "steps": float(steps) if steps else None,
            "ess": float(ess) if ess else None,
            "status": "pending" if not chunks else (st or "ok"),
            "context": _context(family, params),
            "change": float(change) if change else None,
        }
        models.append(entry)
        streams.setdefault((tenant, stream), []).append(entry)
    return models, streams


def _context(family: str, params_json: str) -> int:
    """The model's context (:func:`workers.comparison.model_context`); 0 for a config that does not build (the
    API accepted it, so only an unknown family left by an older version)."""
    try:
        return comparison.family_context(family, params_json)
    except Exception:
        return 0


def _family(name: str, doc: str, kind: str, samples: list[tuple[str, float]]) -> str:
    """One metric family in the text format (0.0.4); ``samples``: (rendered label pairs ``k="v",...``, value).

    prometheus_client's ``generate_latest`` validates and escapes every label of every sample (about
    100 µs a line, 3 s for the 34,000 lines of 3,000 models); here the label names are fixed and each
    model's label values are escaped once.
    """
    lines = [f"{name}{{{pairs}}} {_num(v)}\n" for pairs, v in samples]
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n" + "".join(lines)


def _num(v: float) -> str:
    v = float(v)
    return repr(v) if math.isfinite(v) else floatToGoString(v)


def _pairs(names: list[str], values: tuple[str, ...]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in zip(names, values, strict=True))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _model_families(
    models: list[dict[str, Any]],
    stream_chunks: dict[tuple[str, str], int],
    posts: dict[tuple[str, str], dict[str, Any]],
) -> str:
    """The per-model gauges (labels ``tenant, stream, model``) and ``sgais_model_status`` one-hot over STATUSES,
    in the text format."""
    pairs = {
        (e["tenant"], e["stream"], e["model"]): _pairs(MODEL_LABELS, (e["tenant"], e["stream"], e["model"]))
        for e in models
    }
    lab = [(pairs[(e["tenant"], e["stream"], e["model"])], e) for e in models]
    probability = []
    for (tenant, s), post in posts.items():
        probability += [
            (pairs[(tenant, s, x["model"])], x["probability"])
            for x in post["models"]
            if x.get("probability") is not None
        ]
    out = [
        _family("sgais_log_evidence", "running log-evidence (nats)", "gauge", [(p, e["log_evidence"]) for p, e in lab]),
        _family(
            "sgais_log_evidence_se",
            "Monte Carlo standard error of the running log-evidence (nats)",
            "gauge",
            [(p, e["log_evidence_se"]) for p, e in lab if e["log_evidence_se"] is not None],
        ),
        _family(
            "sgais_log_evidence_per_observation",
            "log-evidence per observation (nats)",
            "gauge",
            [(p, e["log_evidence"] / e["observations"]) for p, e in lab if e["observations"]],
        ),
        _family("sgais_model_probability", "posterior model probability on its stream", "gauge", probability),
        _family(
            "sgais_observations_processed",
            "observations absorbed by the model",
            "gauge",
            [(p, e["observations"]) for p, e in lab],
        ),
        _family(
            "sgais_chunks_pending",
            "chunks of the stream not yet absorbed by the model",
            "gauge",
            [(p, max(stream_chunks[(e["tenant"], e["stream"])] - e["chunks"], 0)) for p, e in lab],
        ),
        _family(
            "sgais_annealing_steps",
            "annealing steps of the last block",
            "gauge",
            [(p, e["steps"]) for p, e in lab if e["steps"] is not None],
        ),
        _family(
            "sgais_ess",
            "ESS of the particles after the last block (particles)",
            "gauge",
            [(p, e["ess"]) for p, e in lab if e["ess"] is not None],
        ),
        _family(
            "sgais_change_probability",
            "posterior probability of a change in the model's current segment (issue 12, workers/segmented.py)",
            "gauge",
            [(p, e["change"]) for p, e in lab if e["change"] is not None],
        ),
        _family(
            "sgais_model_status",
            "1 for the model's current status (pending, ok, degraded, error), 0 for the others",
            "gauge",
            [(f'{p},status="{st}"', 1.0 if e["status"] == st else 0.0) for p, e in lab for st in STATUSES],
        ),
    ]
    return "".join(out)


def _stream_alerts(by_stream: dict[str, dict[str, str]], streams: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    """``sgais_stream_alerts_total{tenant, stream, kind}`` from the tenants' ``stream/kind`` counts, for every
    stream that has models now (a stream whose models were all deleted has no series).  Every kind of
    API.md starts at 0, so ``increase()`` sees a stream's first alert (a counter born at 1 shows no increase)."""
    raised: dict[tuple[str, str], dict[str, float]] = {}
    for tenant, fields in by_stream.items():
        for field, count in fields.items():
            stream, _, kind = field.rpartition("/")
            raised.setdefault((tenant, stream), {})[kind] = float(count)
    samples = []
    for tenant, s in sorted(streams):
        counts = {**dict.fromkeys(ALERT_KINDS, 0.0), **raised.get((tenant, s), {})}
        samples += [(_pairs(["tenant", "stream", "kind"], (tenant, s, k)), v) for k, v in sorted(counts.items())]
    return _family("sgais_stream_alerts_total", "alerts raised on a stream, by kind", "counter", samples)


def _aggregate_families(
    alerts_by_kind: dict[str, str],
    hist: dict[str, str],
    worker_ids: list[str],
    beats: list[str | None],
    loads: dict[str, str],
) -> list[Any]:
    """Alerts by kind, the block latency histogram, the workers' leases and engine loads (no tenant, stream or
    model)."""
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
    load = GaugeMetricFamily(
        "sgais_worker_load",
        "engine seconds per second of the models the worker holds, as it measured them at its last scan: the "
        "quantity the lease shares balance (workers/worker/leases.py)",
        labels=["worker"],
    )
    for wid in worker_ids:
        share = records.parse_share(loads.get(wid))
        if share is not None:
            load.add_metric([wid], share[0])
    families.append(load)
    return families


async def _worker_model_counter(r: aioredis.Redis, key: str, name: str, doc: str) -> CounterMetricFamily:
    """A counter by worker and model from a ``worker|T/model -> count`` hash (``P:metrics:lease_losses``...)."""
    family = CounterMetricFamily(name, doc, labels=["worker", "tenant", "model"])
    for field, count in sorted((await r.hgetall(key)).items()):
        family.add_metric(list(parse_counter_field(field)), float(count))
    return family


class _Static:
    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self):
        return iter(self.families)
