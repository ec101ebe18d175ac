-- Fenced commit of one chunk's results (workers/store/commit.py, DESIGN.md §2): ONE round trip.
-- Prepended with stream_state.lua.
-- KEYS: lease, checkpoint, trace, alerts, alerts_total, block_seconds, stream meta, stream models, leader,
-- stream observations (sorted set: model -> committed observations, +inf once in error).
-- ARGV: token, lease ttl (ms), events channel; then the stream query: this model's name ('' = no
-- query, and nothing more of it follows), its observations after this commit, the key prefixes of
-- model configs, checkpoints and traces, the known names comma-separated; then four counted sections:
-- n checkpoint fields + n (field, value); n trace rows + n (score, row JSON); n histogram entries +
-- n (bucket or '', seconds); n evidence events + n (chunks processed, the event's JSON text without its
-- last member and closing brace: the script adds the last member, chunks_pending, from the stream's chunk
-- count read in the same atomic step); n alerts + n (kind, alert JSON, event JSON, score).
-- Returns {'lost'} (nothing written), {'ok'}, or {'moved', <stream state>} (written).
local at = 0
local function nxt() at = at + 1; return ARGV[at] end
local token, ttl, channel = nxt(), nxt(), nxt()
if redis.call('GET', KEYS[1]) ~= token then return {'lost'} end
-- reads first: nothing below the first write can fail half-way
local view, zadd_me, my_obs = nil, false, 0
local me = nxt()
if me ~= '' then
  my_obs = tonumber(nxt())
  local model_prefix, ckpt_prefix, trace_prefix, known = nxt(), nxt(), nxt(), nxt()
  -- The common count from the sorted set (O(log K)) when it holds every model of the stream: when it equals
  -- the leader record's, nothing moved and the O(K) read of every model is skipped (a round of K models on
  -- one stream cost O(K²) otherwise).  A set without every model (a stream older than it) takes the O(K) path.
  local same = false
  if redis.call('ZCARD', KEYS[10]) == redis.call('SCARD', KEYS[8]) then
    local leader = redis.call('GET', KEYS[9])
    if leader then
      local count = my_obs
      local low = redis.call('ZRANGE', KEYS[10], 0, 1, 'WITHSCORES')
      for i = 1, #low, 2 do
        if low[i] ~= me then
          local o = tonumber(low[i + 1])
          if o and o < count then count = o end
          break
        end
      end
      same = cjson.decode(leader)['observations'] == count
    end
  end
  if not same then
    view = stream_state(KEYS[8], KEYS[9], model_prefix, ckpt_prefix, trace_prefix, known, me, my_obs)
  end
  zadd_me = true
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
  redis.call('PUBLISH', channel, head .. ', "chunks_pending": ' .. math.max(stream_chunks - chunks, 0) .. '}')
end
for _ = 1, tonumber(nxt()) do
  local kind, body, event, score = nxt(), nxt(), nxt(), nxt()
  redis.call('ZADD', KEYS[4], score, body)
  redis.call('HINCRBY', KEYS[5], kind, 1)
  redis.call('HINCRBY', KEYS[4] .. ':by_stream', cjson.decode(body)['stream'] .. '/' .. kind, 1)
  redis.call('PUBLISH', channel, event)
end
if zadd_me then redis.call('ZADD', KEYS[10], my_obs, me) end
redis.call('PEXPIRE', KEYS[1], ttl)
if view then return {'moved', unpack(view)} end
return {'ok'}
