"""Async Redis access of the API: models, chunk ingest (atomic Lua), evidence, trace, stream posterior.

Every route reads and writes through these functions.  They raise the store's domain errors
(:mod:`workers.store.errors`: ``NotFound``, ``Conflict``, ``SeqGap``, ``NotReady``, ``SchemaMismatch``),
which ``service/app.py`` maps to HTTP; nothing here knows HTTP."""

from __future__ import annotations

import hashlib
import json
import secrets
from functools import lru_cache
from typing import Any

import redis.asyncio as aioredis
from redis.client import NEVER_DECODE

from workers import comparison
from workers.store import records
from workers.store.errors import Conflict, NotFound, NotReady, SchemaMismatch, SeqGap
from workers.store.keys import Keys, model_ref
from workers.store.scripts import HMGET_EACH_LUA, INGEST_LUA, POSTERIOR_STATES_LUA, ROWS_AT_LUA


async def get_model(r: aioredis.Redis, keys: Keys, tenant: str, name: str) -> dict[str, Any]:
    """The model config.  Raises NotFound when it does not exist in the tenant."""
    raw = await r.get(keys.model(tenant, name))
    if raw is None:
        raise NotFound("model", name)
    return json.loads(raw)


async def get_meta(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> dict[str, str]:
    """The stream meta hash.  Raises NotFound when the stream does not exist in the tenant."""
    meta = await r.hgetall(keys.meta(tenant, stream))
    if not meta:
        raise NotFound("stream", stream)
    return meta


async def ingest(
    r: aioredis.Redis, keys: Keys, tenant: str, stream: str, seq: int | None, chunk: dict[str, Any], n: int
) -> dict[str, Any]:
    """Append a validated, encoded chunk to the stream log atomically; the ack body.

    Raises NotFound (no stream), SeqGap (``seq`` past the next one), Conflict (replay with different content).
    """
    digest = hashlib.sha256()
    for field in ("x_shape", "y_shape", "x", "y"):
        v = chunk[field]
        digest.update(v if isinstance(v, bytes) else v.encode())
        digest.update(b"|")
    res = await r.eval(
        INGEST_LUA,
        3,
        keys.meta(tenant, stream),
        keys.log(tenant, stream),
        keys.seqs(tenant, stream),
        "" if seq is None else str(seq),
        digest.hexdigest(),
        str(n),
        chunk["x_shape"],
        chunk["y_shape"],
        chunk["x"],
        chunk["y"],
    )
    outcome = res[0].decode() if isinstance(res[0], bytes) else res[0]
    if outcome == "missing":
        raise NotFound("stream", stream)
    if outcome == "gap":
        raise SeqGap(f"seq: expected {int(res[1]) + 1}, got {seq} (gap)")
    if outcome == "conflict":
        raise Conflict(f"seq: chunk {seq} was accepted with different content")
    return {
        "stream": stream,
        "seq": int(res[1]),
        "first_index": int(res[2]),
        "n_observations": int(res[3]),
        "duplicate": outcome == "duplicate",
    }


CKPT_FIELDS = ("chunks", "observations", "log_evidence", "log_evidence_se", "last_block", "status", "error")


async def list_models(r: aioredis.Redis, keys: Keys, tenant: str) -> list[dict[str, Any]]:
    """Every model config of the tenant, by name."""
    names = sorted(await r.smembers(keys.tenant_models(tenant)))
    raws = await r.mget([keys.model(tenant, n) for n in names]) if names else []
    return [json.loads(raw) for raw in raws if raw is not None]


async def trace(
    r: aioredis.Redis, keys: Keys, tenant: str, model: str, since_index: int, limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` trace rows with ``first_index >= since_index``, in stream order.  Raises NotFound."""
    await get_model(r, keys, tenant, model)
    rows = await r.zrangebyscore(keys.trace(tenant, model), since_index, "+inf", start=0, num=limit)
    return [json.loads(row) for row in rows]


async def checkpoint_state(r: aioredis.Redis, keys: Keys, tenant: str, model: str) -> bytes:
    """The model's particles after its last committed chunk (safetensors bytes, :func:`workers.engine.read_checkpoint`):
    the checkpoint's ``view`` when the worker deferred the full state (:meth:`workers.worker.loop.Worker.state_due`),
    else its ``state``.  Raises NotFound (no model), NotReady (no worker has picked the model up yet)."""
    await get_model(r, keys, tenant, model)
    state = await latest_particles(r, keys.checkpoint(tenant, model))
    if state is None:
        raise NotReady(f"model {model!r} has not been picked up by a worker yet")
    return state


async def latest_particles(r: aioredis.Redis, checkpoint_key: str) -> bytes | None:
    """The checkpoint's ``view`` if it has a non-empty one, else its ``state`` (None before the first commit)."""
    view, state = await r.execute_command("HMGET", checkpoint_key, "view", "state", **{NEVER_DECODE: True})
    return view or state


async def stream_meta(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> tuple[dict[str, str], list[str]]:
    """The stream's meta hash and its models' names, sorted (one round trip, one atomic read: the meta's
    ``models_etag`` names that set of models, :func:`create_model`).  Raises NotFound."""
    pipe = r.pipeline(transaction=True)
    pipe.hgetall(keys.meta(tenant, stream))
    pipe.smembers(keys.stream_models(tenant, stream))
    meta, names = await pipe.execute()
    if not meta:
        raise NotFound("stream", stream)
    return meta, sorted(names)


async def stream_status(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> dict[str, Any]:
    """The stream's schema, chunk and observation counts, and each model's progress (two round trips, the second
    one Lua call over the models: clients poll this).  Raises NotFound."""
    meta, names = await stream_meta(r, keys, tenant, stream)
    fields = ("chunks", "observations")
    got = await r.eval(HMGET_EACH_LUA, 0, keys.checkpoint(tenant, ""), len(fields), *fields, *names) if names else []
    models = [
        {"name": m, "chunks_processed": int(c or 0), "observations_processed": int(o or 0)}
        for m, (c, o) in zip(names, got, strict=True)
    ]
    return {
        "name": stream,
        "schema": json.loads(meta["schema"]),
        "chunks": int(meta.get("chunks", 0)),
        "observations": int(meta.get("observations", 0)),
        "models": models,
    }


async def stream_exists(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> bool:
    return bool(await r.exists(keys.meta(tenant, stream)))


async def checkpoint(r: aioredis.Redis, keys: Keys, tenant: str, model: str) -> dict[str, str] | None:
    vals = await r.hmget(keys.checkpoint(tenant, model), CKPT_FIELDS)
    if vals[0] is None:
        return None
    return {k: v for k, v in zip(CKPT_FIELDS, vals, strict=True) if v is not None}


async def evidence(r: aioredis.Redis, keys: Keys, tenant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    ckpt = await checkpoint(r, keys, tenant, cfg["name"])
    chunks = await r.hget(keys.meta(tenant, cfg["stream"]), "chunks")
    return records.evidence_body(cfg["name"], cfg["stream"], ckpt, int(chunks or 0))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else v


@lru_cache(maxsize=8192)
def _posterior_part(raw: str | bytes) -> tuple[dict[str, Any], int]:
    """What the stream posterior reads of a model config (its JSON text): ``{"prior_probability"}`` and the model's
    context (:func:`workers.comparison.model_context`), kept by the text (parsing every config of a stream of 1,000
    models took a third of a posterior request)."""
    cfg = json.loads(raw)
    return {"prior_probability": cfg["prior_probability"]}, comparison.model_context(cfg)


async def stream_posterior(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> dict[str, Any]:
    """Posterior model probabilities at the largest count every active model has processed, every model
    scored on the observations after the stream's largest context (:mod:`workers.comparison`).  Its reads are Lua
    calls over the stream's models (``lua/posterior_states.lua``, ``lua/rows_at.lua``), not a command per model."""
    names, cfgs, obs, sts, errs = await r.eval(
        POSTERIOR_STATES_LUA, 1, keys.stream_models(tenant, stream), keys.model(tenant, ""), keys.checkpoint(tenant, "")
    )
    states: dict[str, dict[str, Any]] = {}
    for i in sorted(range(len(names)), key=lambda i: _text(names[i])):
        if cfgs[i] is not None:
            cfg, context = _posterior_part(cfgs[i])
            states[_text(names[i])] = records.model_state(cfg, obs[i], sts[i], errs[i], context=context)
    count = records.common_count(states)
    context = comparison.stream_context([s["context"] for s in states.values()])
    active = [m for m in states if states[m]["status"] != "error"]

    async def rows_at(c: int, models: list[str]) -> dict[str, dict[str, Any] | None]:
        got = await r.eval(ROWS_AT_LUA, 0, keys.trace(tenant, ""), c, *models) if models else []
        return {m: records.row_covering([] if row is None else [row], c) for m, row in zip(models, got, strict=True)}

    rows_n = await rows_at(count, active) if count > 0 else {}
    scored = [m for m in active if (rows_n.get(m) or {}).get("observations") == count]
    conditioned_on, rows_c = context, {}
    while 0 < conditioned_on < count and scored:
        rows_c = await rows_at(conditioned_on, scored)
        nxt = comparison.next_common_count(
            conditioned_on, {m: (x or {}).get("observations") for m, x in rows_c.items()}
        )
        if nxt == conditioned_on:
            break
        conditioned_on = count if nxt is None else nxt
    return records.stream_posterior(stream, count, conditioned_on, records.posterior_entries(states, rows_n, rows_c))


#: The stream meta field that names the stream's set of model configs: a new random token with every model created or
#: deleted (the stream deleted with its meta), so that ``(stream, token)`` never names two different sets, even across
#: a stream deleted and created again.  ``service.routes.chunks.stream_configs`` keeps the parsed configs by it.
MODELS_ETAG = "models_etag"
# a new token, on a stream that still exists (its meta is the stream's existence: NotFound without it)
_NEW_ETAG_LUA = "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end"


async def create_model(r: aioredis.Redis, keys: Keys, tenant: str, cfg: dict[str, Any], schema: dict[str, Any]) -> None:
    """Store a new model (and its stream, if new) in one transaction.

    Raises Conflict (name taken), SchemaMismatch (schema differs from the stream's).
    """
    name, stream = cfg["name"], cfg["stream"]
    mkey, meta = keys.model(tenant, name), keys.meta(tenant, stream)
    async with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(mkey, meta)
                if await pipe.exists(mkey):
                    raise Conflict(f"model {name!r} already exists")
                existing = await pipe.hget(meta, "schema")
                if existing is not None and json.loads(existing) != schema:
                    msg = f"stream {stream!r} takes observations {existing}; this model takes {json.dumps(schema)}"
                    raise SchemaMismatch([{"loc": ["body", "params"], "type": "schema_mismatch", "msg": msg}])
                pipe.multi()
                pipe.set(mkey, json.dumps(cfg))
                pipe.hset(meta, MODELS_ETAG, secrets.token_hex(8))
                pipe.sadd(keys.tenant_models(tenant), name)
                pipe.sadd(keys.stream_models(tenant, stream), name)
                pipe.zadd(keys.stream_obs(tenant, stream), {name: 0})
                if existing is None:
                    pipe.hset(
                        meta,
                        mapping={
                            "schema": json.dumps(schema),
                            "family": cfg["family"],
                            "params": json.dumps(cfg["params"]),
                            "chunks": 0,
                            "observations": 0,
                        },
                    )
                pipe.sadd(keys.models, model_ref(tenant, name))
                await pipe.execute()
                return
            except aioredis.WatchError:
                continue


async def delete_model(r: aioredis.Redis, keys: Keys, tenant: str, cfg: dict[str, Any]) -> None:
    """Remove a model's config, state, trace, lease and alerts (the stream stays)."""
    name = cfg["name"]
    alerts = await r.zrange(keys.alerts(tenant), 0, -1)
    mine = [a for a in alerts if json.loads(a)["model"] == name]
    pipe = r.pipeline(transaction=True)
    pipe.srem(keys.models, model_ref(tenant, name))
    pipe.delete(
        keys.model(tenant, name),
        keys.checkpoint(tenant, name),
        keys.trace(tenant, name),
        keys.lease(tenant, name),
        keys.attempts(tenant, name),
    )
    pipe.srem(keys.tenant_models(tenant), name)
    pipe.srem(keys.stream_models(tenant, cfg["stream"]), name)
    pipe.zrem(keys.stream_obs(tenant, cfg["stream"]), name)
    pipe.eval(_NEW_ETAG_LUA, 1, keys.meta(tenant, cfg["stream"]), MODELS_ETAG, secrets.token_hex(8))
    if mine:
        pipe.zrem(keys.alerts(tenant), *mine)
    await pipe.execute()
