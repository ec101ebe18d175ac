"""Stream-level Redis operations of the API (issue 11): deleting a stream, and a tenant's backlog for quotas.

Both are single Lua scripts: atomic, one round trip.  Like the commit scripts (``workers/store/commit.py``)
they read keys by name built from prefixes, which a single Redis (not a cluster) allows.
"""

from __future__ import annotations

from typing import Any

from workers.store.keys import Keys

# KEYS: stream models, meta, log, seqs, leader, tenant alerts, P:models, tenant models, stream observations
# (sorted set).
# ARGV: prefixes of model configs, checkpoints, traces, leases; tenant; stream; prefix of attempt records.
# Returns -1 when the stream does not exist, else the number of models removed.
# Deleting a model's lease fences the worker holding it: its next renewal or commit finds another
# token (none) and it drops the model (LeaseLost), as for DELETE /v1/models/{model}.
DELETE_STREAM_LUA = """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local names = redis.call('SMEMBERS', KEYS[1])
for _, m in ipairs(names) do
  redis.call('UNLINK', ARGV[1] .. m, ARGV[2] .. m, ARGV[3] .. m, ARGV[4] .. m, ARGV[7] .. m)
  redis.call('SREM', KEYS[8], m)
  redis.call('SREM', KEYS[7], ARGV[5] .. '/' .. m)
end
local alerts = redis.call('ZRANGE', KEYS[6], 0, -1)
for _, a in ipairs(alerts) do
  local ok, dec = pcall(cjson.decode, a)
  if ok and type(dec) == 'table' and dec['stream'] == ARGV[6] then redis.call('ZREM', KEYS[6], a) end
end
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[9])
return #names
"""

# KEYS: tenant models.  ARGV: prefixes of model configs, checkpoints, streams.
# Returns {models, pending observations summed over the models not in error}.
BACKLOG_LUA = """
local names = redis.call('SMEMBERS', KEYS[1])
local total, streams = 0, {}
for _, m in ipairs(names) do
  local raw = redis.call('GET', ARGV[1] .. m)
  if raw then
    local ok, cfg = pcall(cjson.decode, raw)
    if ok and type(cfg) == 'table' and cfg['stream'] then
      local s = cfg['stream']
      local obs = streams[s]
      if obs == nil then
        obs = tonumber(redis.call('HGET', ARGV[3] .. s .. ':meta', 'observations') or '0') or 0
        streams[s] = obs
      end
      local c = redis.call('HMGET', ARGV[2] .. m, 'observations', 'status')
      if c[2] ~= 'error' then total = total + math.max(0, obs - (tonumber(c[1] or '0') or 0)) end
    end
  end
end
return {#names, total}
"""


async def delete_stream(r: Any, keys: Keys, tenant: str, stream: str) -> int | None:
    """Remove a stream's log, meta, models (configs, checkpoints, traces, leases) and alerts atomically.

    Returns
    -------
    int | None
        The number of models removed; None when the stream does not exist in the tenant.
    """
    n = await r.eval(
        DELETE_STREAM_LUA,
        9,
        keys.stream_models(tenant, stream),
        keys.meta(tenant, stream),
        keys.log(tenant, stream),
        keys.seqs(tenant, stream),
        keys.leader(tenant, stream),
        keys.alerts(tenant),
        keys.models,
        keys.tenant_models(tenant),
        keys.stream_obs(tenant, stream),
        keys.model(tenant, ""),
        keys.checkpoint(tenant, ""),
        keys.trace(tenant, ""),
        keys.lease(tenant, ""),
        tenant,
        stream,
        keys.attempts(tenant, ""),
    )
    return None if int(n) < 0 else int(n)


async def tenant_backlog(r: Any, keys: Keys, tenant: str) -> tuple[int, int]:
    """``(models, pending observations)`` of a tenant: its model count, and the stream observations its
    models (those not in ``error``) have still to absorb, summed over the models."""
    models, pending = await r.eval(
        BACKLOG_LUA,
        1,
        keys.tenant_models(tenant),
        keys.model(tenant, ""),
        keys.checkpoint(tenant, ""),
        keys.log(tenant, ""),
    )
    return int(models), int(pending)
