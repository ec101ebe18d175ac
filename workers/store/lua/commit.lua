-- Fenced commits of chunks' results (workers/store/commit.py, DESIGN.md §2): several models' commits in ONE
-- script call, run one after the other, each fenced by its own model's lease token and each applied as one
-- atomic step of this script.  Prepended with stream_state.lua.
-- KEYS, 10 per commit in order: lease, checkpoint, trace, alerts, alerts_total, block_seconds, stream meta,
-- stream models, leader, stream observations (sorted set: model -> committed observations, +inf once in error).
-- ARGV: the number of commits; the number of known-model lists, then the lists (the names of models whose config
-- the worker has, comma-separated: one per stream of the call, not one per commit); then per commit the number of
-- its arguments and its arguments: token, lease ttl (ms), events channel; then the stream query: this model's name
-- ('' = no query, and nothing more of it follows), its observations after this commit, the key prefixes of model
-- configs, checkpoints and traces, the number of its known-model list; then four counted sections: n checkpoint
-- fields + n (field, value); n trace rows + n (score, row JSON); n histogram entries + n (bucket or '', seconds);
-- n evidence events + n (chunks processed, the event's JSON text without its last member and closing brace: the
-- script adds the last member, chunks_pending, from the stream's chunk count read in the same atomic step); n alerts
-- + n (kind, alert JSON, event JSON, score).
-- Returns one reply per commit: {'lost'} (nothing written), {'ok'}, {'moved', <stream state>} (written), or
-- {'error', message}: the commit raised before its first write (its reads come first), nothing of it written.
-- A call returns a stream's state once per common count (its first applied commit that sees the count moved).
local at = 0
local function nxt() at = at + 1; return ARGV[at] end

local viewed = {}  -- stream models key -> the common count of the last state this call returned
local knowns  -- the call's known-model lists (ARGV, read before the commits)

local function commit(K)
  local token, ttl, channel = nxt(), nxt(), nxt()
  if redis.call('GET', K[1]) ~= token then return {'lost'} end
  -- reads first: nothing below the first write can fail half-way
  local view, zadd_me, my_obs = nil, false, 0
  local me = nxt()
  if me ~= '' then
    my_obs = tonumber(nxt())
    local model_prefix, ckpt_prefix, trace_prefix, known = nxt(), nxt(), nxt(), knowns[tonumber(nxt())]
    -- The common count from the sorted set (O(log K)) when it holds every model of the stream: when it equals
    -- the leader record's, nothing moved and the O(K) read of every model is skipped (a round of K models on
    -- one stream cost O(K²) otherwise).  A set without every model (a stream older than it) takes the O(K) path.
    local same = false
    if redis.call('ZCARD', K[10]) == redis.call('SCARD', K[8]) then
      local count = my_obs
      local low = redis.call('ZRANGE', K[10], 0, 1, 'WITHSCORES')
      for i = 1, #low, 2 do
        if low[i] ~= me then
          local o = tonumber(low[i + 1])
          if o and o < count then count = o end
          break
        end
      end
      local leader = redis.call('GET', K[9])
      same = leader and cjson.decode(leader)['observations'] == count
      -- An earlier commit of this call returned the stream's state at this count: the worker stores that
      -- posterior (a later reply at the same count would find the record written and do nothing).  Without this
      -- a fresh stream's first round (no leader record yet) read all K models for each of its K commits.
      same = same or viewed[K[8]] == count
    end
    if not same then
      view = stream_state(K[8], K[9], model_prefix, ckpt_prefix, trace_prefix, known, me, my_obs)
    end
    zadd_me = true
  end
  local stream_chunks = tonumber(redis.call('HGET', K[7], 'chunks') or '0')
  local fields = {}
  for _ = 1, tonumber(nxt()) do fields[#fields + 1] = nxt(); fields[#fields + 1] = nxt() end
  redis.call('HSET', K[2], unpack(fields))
  local zargs = {}
  for i = 1, tonumber(nxt()) do  -- in batches: unpack() takes a few thousand values at most
    zargs[#zargs + 1] = nxt(); zargs[#zargs + 1] = nxt()
    if #zargs == 1000 then redis.call('ZADD', K[3], unpack(zargs)); zargs = {} end
  end
  if #zargs > 0 then redis.call('ZADD', K[3], unpack(zargs)) end
  for _ = 1, tonumber(nxt()) do
    local le, seconds = nxt(), nxt()
    if le ~= '' then redis.call('HINCRBY', K[6], le, 1) end
    redis.call('HINCRBY', K[6], 'count', 1)
    redis.call('HINCRBYFLOAT', K[6], 'sum', seconds)
  end
  for _ = 1, tonumber(nxt()) do
    local chunks, head = tonumber(nxt()), nxt()
    redis.call('PUBLISH', channel, head .. ', "chunks_pending": ' .. math.max(stream_chunks - chunks, 0) .. '}')
  end
  for _ = 1, tonumber(nxt()) do
    local kind, body, event, score = nxt(), nxt(), nxt(), nxt()
    redis.call('ZADD', K[4], score, body)
    redis.call('HINCRBY', K[5], kind, 1)
    redis.call('HINCRBY', K[4] .. ':by_stream', cjson.decode(body)['stream'] .. '/' .. kind, 1)
    redis.call('PUBLISH', channel, event)
  end
  if zadd_me then redis.call('ZADD', K[10], my_obs, me) end
  redis.call('PEXPIRE', K[1], ttl)
  if view then return {'moved', unpack(view)} end
  return {'ok'}
end

local replies = {}
local commits = tonumber(nxt())
knowns = {}
for i = 1, tonumber(nxt()) do knowns[i] = nxt() end
for i = 1, commits do
  local after = tonumber(nxt()) + at  -- where the next commit's arguments start, whatever this one read
  local ok, reply = pcall(commit, {unpack(KEYS, 10 * i - 9, 10 * i)})
  if not ok then reply = {'error', type(reply) == 'table' and reply.err or tostring(reply)} end
  -- a state returned (by a commit that applied: one that raised returns none) at this stream's count
  if reply[1] == 'moved' then viewed[KEYS[10 * i - 2]] = reply[2] end
  replies[i] = reply
  at = after
end
return replies
