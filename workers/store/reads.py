"""Async Redis access of the API: models, chunk ingest (atomic Lua), evidence, stream posterior."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import redis.asyncio as aioredis
from fastapi import HTTPException, status

from workers import comparison
from workers.store import records
from workers.store.keys import Keys, model_ref

# Seq check + XADD + meta update in one atomic step: a rejected chunk leaves no trace.
# KEYS: meta, log, seqs.  ARGV: seq ("" = next), sha256, n, x_shape, y_shape, x, y.
# Returns {status, seq, first_index, n}: status ok | duplicate | gap | conflict | missing.
INGEST_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing', 0, 0, 0} end
local chunks = tonumber(redis.call('HGET', KEYS[1], 'chunks') or '0')
local obs = tonumber(redis.call('HGET', KEYS[1], 'observations') or '0')
if ARGV[1] ~= '' then
  local seq = tonumber(ARGV[1])
  if seq <= chunks then
    local rec = redis.call('HGET', KEYS[3], ARGV[1])
    if rec then
      local h, fi, n = string.match(rec, '^(%x+):(%d+):(%d+)$')
      if h == ARGV[2] then return {'duplicate', seq, tonumber(fi), tonumber(n)} end
    end
    return {'conflict', chunks, 0, 0}
  end
  if seq ~= chunks + 1 then return {'gap', chunks, 0, 0} end
end
local seq = chunks + 1
local n = tonumber(ARGV[3])
redis.call('XADD', KEYS[2], '*', 'seq', seq, 'first_index', obs, 'n', n,
           'x_shape', ARGV[4], 'y_shape', ARGV[5], 'x', ARGV[6], 'y', ARGV[7])
redis.call('HSET', KEYS[1], 'chunks', seq, 'observations', obs + n)
redis.call('HSET', KEYS[3], tostring(seq), ARGV[2] .. ':' .. obs .. ':' .. n)
return {'ok', seq, obs, n}
"""


def not_found(what: str, name: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"{what} {name!r} not found")


async def get_model(r: aioredis.Redis, keys: Keys, tenant: str, name: str) -> dict[str, Any]:
    """The model config; 404 when it does not exist in the tenant."""
    raw = await r.get(keys.model(tenant, name))
    if raw is None:
        raise not_found("model", name)
    return json.loads(raw)


async def get_meta(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> dict[str, str]:
    """The stream meta hash; 404 when the stream does not exist in the tenant."""
    meta = await r.hgetall(keys.meta(tenant, stream))
    if not meta:
        raise not_found("stream", stream)
    return meta


async def ingest(
    r: aioredis.Redis, keys: Keys, tenant: str, stream: str, seq: int | None, chunk: dict[str, Any], n: int
) -> dict[str, Any]:
    """Append a validated, encoded chunk to the stream log atomically; the ack body.

    Raises HTTPException 404 (no stream), 409 (seq gap or replay with different content).
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
        raise not_found("stream", stream)
    if outcome == "gap":
        raise HTTPException(status.HTTP_409_CONFLICT, f"seq: expected {int(res[1]) + 1}, got {seq} (gap)")
    if outcome == "conflict":
        raise HTTPException(status.HTTP_409_CONFLICT, f"seq: chunk {seq} was accepted with different content")
    return {
        "stream": stream,
        "seq": int(res[1]),
        "first_index": int(res[2]),
        "n_observations": int(res[3]),
        "duplicate": outcome == "duplicate",
    }


CKPT_FIELDS = ("chunks", "observations", "log_evidence", "last_block", "status", "error")


async def checkpoint(r: aioredis.Redis, keys: Keys, tenant: str, model: str) -> dict[str, str] | None:
    vals = await r.hmget(keys.checkpoint(tenant, model), CKPT_FIELDS)
    if vals[0] is None:
        return None
    return {k: v for k, v in zip(CKPT_FIELDS, vals) if v is not None}


async def evidence(r: aioredis.Redis, keys: Keys, tenant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    ckpt = await checkpoint(r, keys, tenant, cfg["name"])
    chunks = await r.hget(keys.meta(tenant, cfg["stream"]), "chunks")
    return records.evidence_body(cfg["name"], cfg["stream"], ckpt, int(chunks or 0))


async def stream_posterior(r: aioredis.Redis, keys: Keys, tenant: str, stream: str) -> dict[str, Any]:
    """Posterior model probabilities at the largest count every active model has processed, every model
    scored on the observations after the stream's largest context (:mod:`workers.comparison`)."""
    names = sorted(
        x.decode() if isinstance(x, bytes) else x for x in await r.smembers(keys.stream_models(tenant, stream))
    )
    pipe = r.pipeline(transaction=False)
    for m in names:
        pipe.get(keys.model(tenant, m))
        pipe.hmget(keys.checkpoint(tenant, m), ["observations", "status", "error"])
    got = await pipe.execute()
    states: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(names):
        cfg, (obs, st, err) = got[2 * i], got[2 * i + 1]
        if cfg is None:
            continue
        states[m] = records.model_state(json.loads(cfg), obs, st, err)
    count = records.common_count(states)
    context = comparison.stream_context([s["context"] for s in states.values()])
    active = [m for m in states if states[m]["status"] != "error"]

    async def rows_at(c: int, models: list[str]) -> dict[str, dict[str, Any] | None]:
        pipe = r.pipeline(transaction=False)
        for m in models:
            pipe.zrevrangebyscore(keys.trace(tenant, m), c - 1, "-inf", start=0, num=1)
        return {m: records.row_covering(rows, c) for m, rows in zip(models, await pipe.execute(), strict=True)}

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


async def create_model(r: aioredis.Redis, keys: Keys, tenant: str, cfg: dict[str, Any], schema: dict[str, Any]) -> None:
    """Store a new model (and its stream, if new) in one transaction.

    Raises HTTPException 409 (name taken), 422 (schema differs from the stream's).
    """
    name, stream = cfg["name"], cfg["stream"]
    mkey, meta = keys.model(tenant, name), keys.meta(tenant, stream)
    async with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(mkey, meta)
                if await pipe.exists(mkey):
                    raise HTTPException(status.HTTP_409_CONFLICT, f"model {name!r} already exists")
                existing = await pipe.hget(meta, "schema")
                if existing is not None and json.loads(existing) != schema:
                    raise HTTPException(
                        status.HTTP_422_UNPROCESSABLE_CONTENT,
                        [
                            {
                                "loc": ["body", "params"],
                                "type": "schema_mismatch",
                                "msg": f"stream {stream!r} takes observations {existing}; this model takes {json.dumps(schema)}",
                            }
                        ],
                    )
                pipe.multi()
                pipe.set(mkey, json.dumps(cfg))
                pipe.sadd(keys.tenant_models(tenant), name)
                pipe.sadd(keys.stream_models(tenant, stream), name)
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
        keys.model(tenant, name), keys.checkpoint(tenant, name), keys.trace(tenant, name), keys.lease(tenant, name)
    )
    pipe.srem(keys.tenant_models(tenant), name)
    pipe.srem(keys.stream_models(tenant, cfg["stream"]), name)
    if mine:
        pipe.zrem(keys.alerts(tenant), *mine)
    await pipe.execute()
