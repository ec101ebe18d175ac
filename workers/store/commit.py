"""The worker's fenced commit: Redis Lua scripts and their argument layout (DESIGN.md §2).

A chunk's results reach Redis in ONE round trip, :data:`COMMIT_LUA`.  The script first checks
that the model's lease still holds the worker's token (fencing: a worker whose lease expired,
was taken over, or whose model was deleted writes nothing), then reads everything it needs,
then writes the checkpoint (state, cursor, counters, detector), the trace rows, the
block-latency histogram, the alerts and the ``evidence``/``alert`` events and renews the lease.
A script runs alone on the server and reaches the AOF as one ``MULTI/EXEC``, so the commit is
atomic: a chunk is applied iff the cursor moved past it together with the new state.

The stream posterior (model probabilities at the largest observation count every active model
of the stream has processed, API.md "Model comparison") is derived data.  The commit script
reads the stream's models and its leader record (``{"model", "observations"}``) and, only when
that common count differs from the record's, returns each active model's trace row at the
count.  The worker then computes the probabilities in Python (:mod:`workers.comparison`, the
code the API uses) and stores the new leader record, the ``posterior`` event and any
``model_switch`` alert with :data:`LEADER_LUA`: fenced by the same lease and compare-and-set on
the leader record (``stale`` = another worker moved it first: re-read with :data:`STREAM_LUA`
and recompute).  So one chunk costs one round trip, two when the common count moved.  A worker
killed between the two scripts leaves the leader record one step behind; the next commit on
the stream, or the next worker that restores one of its models, recomputes it from the
committed traces (the same values, so the same alert).

The scripts read the other models' keys by name (``P:T:ckpt:{m}`` ...), which a single Redis
server allows (Redis Cluster would not, nor does the rest of the key layout fit it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from workers.store.keys import BLOCK_SECONDS_BUCKETS, Keys

# Shared by COMMIT_LUA and STREAM_LUA: the stream's models (sorted), each one's observations and
# status (``me`` overridden with the values being committed), the common count, and the leader
# record.  nil when the count equals the record's; else {count, leader JSON or '', names,
# observations, statuses, row at count (JSON or ''), model config ('' when the caller knows it)}.
# Models whose config is gone are left out; so are errored models from the count.
_STREAM_STATE = """
local function stream_state(models_key, leader_key, model_prefix, ckpt_prefix, trace_prefix, known, me, my_obs)
  local names = redis.call('SMEMBERS', models_key)
  table.sort(names)
  local leader = redis.call('GET', leader_key)
  local kept, obs, status, configs = {}, {}, {}, {}
  for _, m in ipairs(names) do
    local cfg = ''
    if not known[m] then cfg = redis.call('GET', model_prefix .. m) end
    if cfg then
      local o, st = my_obs, 'ok'
      if m ~= me then
        local v = redis.call('HMGET', ckpt_prefix .. m, 'observations', 'status')
        o, st = tonumber(v[1]) or 0, v[2] or ''
      end
      local i = #kept + 1
      kept[i] = m; obs[i] = o; status[i] = st; configs[i] = cfg
    end
  end
  local count = nil
  for i = 1, #kept do
    if status[i] ~= 'error' and (count == nil or obs[i] < count) then count = obs[i] end
  end
  count = count or 0
  if leader and cjson.decode(leader)['observations'] == count then return nil end
  local rows = {}
  for i, m in ipairs(kept) do
    rows[i] = ''
    if status[i] ~= 'error' and count > 0 then
      local got = redis.call('ZREVRANGEBYSCORE', trace_prefix .. m, count - 1, '-inf', 'LIMIT', 0, 1)
      if got[1] then rows[i] = got[1] end
    end
  end
  return {count, leader or '', kept, obs, status, rows, configs}
end
"""

# KEYS: lease, checkpoint, trace, alerts, alerts_total, block_seconds, stream meta, stream models, leader.
# ARGV: token, lease ttl (ms), events channel; then the stream query: this model's name ('' = no
# query, and nothing more of it follows), its observations after this commit, the key prefixes of
# model configs, checkpoints and traces, n known names and the names; then four counted sections:
# n checkpoint fields + n (field, value); n trace rows + n (score, row JSON); n histogram entries +
# n (bucket or '', seconds); n evidence events + n (chunks processed, event JSON without its closing
# brace: the script appends the chunks pending, read in the same atomic step); n alerts + n (kind,
# alert JSON, event JSON, score).
# Returns {'lost'} (nothing written), {'ok'}, or {'moved', <stream state>} (written).
COMMIT_LUA = (
    _STREAM_STATE
    + """
local at = 0
local function nxt() at = at + 1; return ARGV[at] end
local token, ttl, channel = nxt(), nxt(), nxt()
if redis.call('GET', KEYS[1]) ~= token then return {'lost'} end
-- reads first: nothing below the first write can fail half-way
local view = nil
local me = nxt()
if me ~= '' then
  local my_obs = tonumber(nxt())
  local model_prefix, ckpt_prefix, trace_prefix = nxt(), nxt(), nxt()
  local known = {}
  for _ = 1, tonumber(nxt()) do known[nxt()] = true end
  view = stream_state(KEYS[8], KEYS[9], model_prefix, ckpt_prefix, trace_prefix, known, me, my_obs)
end
local stream_chunks = tonumber(redis.call('HGET', KEYS[7], 'chunks') or '0')
local fields = {}
for _ = 1, tonumber(nxt()) do fields[#fields + 1] = nxt(); fields[#fields + 1] = nxt() end
redis.call('HSET', KEYS[2], unpack(fields))
local zargs = {}
for i = 1, tonumber(nxt()) do  -- in batches: unpack() takes a few thousand values at most
  zargs[#zargs + 1] = nxt(); zargs[#zargs + 1] = nxt()
  if #zargs == 1000 then redis.call('ZADD', KEYS[3], unpack(zargs)); zargs = {} end
end
if #zargs > 0 then redis.call('ZADD', KEYS[3], unpack(zargs)) end
for _ = 1, tonumber(nxt()) do
  local le, seconds = nxt(), nxt()
  if le ~= '' then redis.call('HINCRBY', KEYS[6], le, 1) end
  redis.call('HINCRBY', KEYS[6], 'count', 1)
  redis.call('HINCRBYFLOAT', KEYS[6], 'sum', seconds)
end
for _ = 1, tonumber(nxt()) do
  local chunks, head = tonumber(nxt()), nxt()
  redis.call('PUBLISH', channel, head .. math.max(stream_chunks - chunks, 0) .. '}')
end
for _ = 1, tonumber(nxt()) do
  local kind, body, event, score = nxt(), nxt(), nxt(), nxt()
  redis.call('ZADD', KEYS[4], score, body)
  redis.call('HINCRBY', KEYS[5], kind, 1)
  redis.call('HINCRBY', KEYS[4] .. ':by_stream', cjson.decode(body)['stream'] .. '/' .. kind, 1)
  redis.call('PUBLISH', channel, event)
end
redis.call('PEXPIRE', KEYS[1], ttl)
if view then return {'moved', unpack(view)} end
return {'ok'}
"""
)

# KEYS: stream models, leader.  ARGV: key prefixes of model configs, checkpoints, traces; n known
# names and the names.  Returns {'same'} or {'moved', <stream state>}.  Writes nothing.
STREAM_LUA = (
    _STREAM_STATE
    + """
local known = {}
for i = 5, 4 + tonumber(ARGV[4]) do known[ARGV[i]] = true end
local view = stream_state(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], known, '', 0)
if view then return {'moved', unpack(view)} end
return {'same'}
"""
)

# KEYS: lease, leader, alerts, alerts_total.  ARGV: token, the leader record read ('' = none),
# the new record, events channel, posterior event ('' = none), alert kind ('' = no alert), alert
# JSON, alert event JSON, alert score.  Returns 'lost' or 'stale' (nothing written), or 'ok'.
LEADER_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return 'stale' end
redis.call('SET', KEYS[2], ARGV[3])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
if ARGV[6] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[9], ARGV[7])
  redis.call('HINCRBY', KEYS[4], ARGV[6], 1)
  redis.call('HINCRBY', KEYS[3] .. ':by_stream', cjson.decode(ARGV[7])['stream'] .. '/' .. ARGV[6], 1)
  redis.call('PUBLISH', ARGV[4], ARGV[8])
end
return 'ok'
"""


@dataclass
class StreamState:
    """What :data:`COMMIT_LUA` / :data:`STREAM_LUA` return when the common count moved.

    ``leader_raw`` is the leader record as stored (b"" when there is none), for the
    compare-and-set; ``models`` holds ``(name, observations, status, row, config)`` per model of
    the stream in name order, ``row`` the trace row JSON ending at ``count`` (b"" if none) and
    ``config`` the model config JSON (b"" when the caller said it knows the model's prior).
    """

    count: int
    leader_raw: bytes
    models: list[tuple[str, int, str, bytes, bytes]]

    @property
    def previous(self) -> dict[str, Any] | None:
        return json.loads(self.leader_raw) if self.leader_raw else None


def parse_state(reply: list) -> StreamState | None:
    """A script reply -> StreamState when it says ``moved``, else None."""
    if reply[0] != b"moved":
        return None
    count, leader, names, obs, status, rows, configs = reply[1:8]
    models = [(n.decode(), int(o), s.decode(), r, c) for n, o, s, r, c in zip(names, obs, status, rows, configs)]
    return StreamState(int(count), leader, models)


class Scripts:
    """The three scripts registered on one Redis client (``EVALSHA``, reloaded after NOSCRIPT), with
    their KEYS/ARGV layout.  Every method is one round trip."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.keys = keys
        self._commit = r.register_script(COMMIT_LUA)
        self._stream = r.register_script(STREAM_LUA)
        self._leader = r.register_script(LEADER_LUA)

    def _query(self, tenant: str, known: list[str]) -> list[Any]:
        k = self.keys
        return [k.model(tenant, ""), k.checkpoint(tenant, ""), k.trace(tenant, ""), len(known), *known]

    def commit(
        self,
        *,
        tenant: str,
        model: str,
        stream: str,
        token: str,
        ttl_ms: int,
        checkpoint: dict[str, Any],
        rows: list[dict],
        events: list[tuple[int, str]],
        alerts: list[dict],
        observations: int,
        known: list[str] | None,
    ) -> StreamState | None:
        """Run :data:`COMMIT_LUA`: the checkpoint hash fields, the trace ``rows`` (scored by ``first_index``,
        each counted in the block-latency histogram by its ``seconds``), ``events`` as ``(chunks processed,
        evidence event head)`` (:func:`workers.store.records.evidence_event_head`), ``alerts`` (full records).
        With ``known`` (the models of the stream whose prior the caller has; None = no query) the stream's
        state is read as of this commit, the model at ``observations``.

        Returns the stream's state when its common count moved (see :class:`StreamState`), else None.

        Raises
        ------
        LeaseLost
            The lease does not hold ``token``: nothing was written.
        """
        k, t = self.keys, tenant
        args: list[Any] = [token, ttl_ms, k.events(t, stream)]
        args += [model, observations, *self._query(t, known)] if known is not None else [""]
        args.append(len(checkpoint))
        for name, value in checkpoint.items():
            args += [name, value]
        args.append(len(rows))
        for row in rows:
            args += [row["first_index"], json.dumps(row)]
        args.append(len(rows))
        for row in rows:
            le = next((b for b in BLOCK_SECONDS_BUCKETS if row["seconds"] <= b), None)
            args += ["" if le is None else str(le), repr(row["seconds"])]
        args.append(len(events))
        for chunks, head in events:
            args += [chunks, head]
        args.append(len(alerts))
        for a in alerts:
            args += [a["kind"], json.dumps(a), json.dumps({"type": "alert", **a}), repr(time.time() * 1000)]
        reply = self._commit(
            keys=[
                k.lease(t, model),
                k.checkpoint(t, model),
                k.trace(t, model),
                k.alerts(t),
                k.alerts_total,
                k.block_seconds,
                k.meta(t, stream),
                k.stream_models(t, stream),
                k.leader(t, stream),
            ],
            args=args,
        )
        if reply[0] == b"lost":
            raise LeaseLost(model)
        return parse_state(reply)

    def stream_state(self, *, tenant: str, stream: str, known: list[str]) -> StreamState | None:
        """Run :data:`STREAM_LUA`: the stream's state when its common count differs from the leader
        record's, else None.  Writes nothing."""
        k = self.keys
        return parse_state(
            self._stream(
                keys=[k.stream_models(tenant, stream), k.leader(tenant, stream)], args=self._query(tenant, known)
            )
        )

    def set_leader(
        self,
        *,
        tenant: str,
        model: str,
        stream: str,
        token: str,
        expected: bytes,
        record: dict[str, Any],
        posterior: dict[str, Any] | None,
        alert: dict[str, Any] | None,
    ) -> bool:
        """Run :data:`LEADER_LUA`: store the leader ``record``, publish the ``posterior`` event body (None =
        none) and store + publish the ``alert`` (None = none), if the leader record is still ``expected``
        (b"" = none).  False (nothing written) when it is not.

        Raises
        ------
        LeaseLost
            The lease does not hold ``token``: nothing was written.
        """
        k, t = self.keys, tenant
        res = self._leader(
            keys=[k.lease(t, model), k.leader(t, stream), k.alerts(t), k.alerts_total],
            args=[
                token,
                expected,
                json.dumps(record),
                k.events(t, stream),
                json.dumps({"type": "posterior", **posterior}) if posterior is not None else "",
                alert["kind"] if alert else "",
                json.dumps(alert) if alert else "",
                json.dumps({"type": "alert", **alert}) if alert else "",
                repr(time.time() * 1000),
            ],
        )
        if res == b"lost":
            raise LeaseLost(model)
        return res == b"ok"


class LeaseLost(Exception):
    """Our lease on a model expired, was taken over, or the model was deleted."""
