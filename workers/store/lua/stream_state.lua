-- Shared by commit.lua and stream.lua (prepended to each, see workers/store/scripts.py): the stream's
-- models (sorted), each one's observations and status (``me`` overridden with the values being committed),
-- the common count, and the leader record.  nil when the count equals the record's; else {count, leader
-- JSON or '', names, observations, statuses, row at count (JSON or ''), model config ('' when the caller
-- knows it)}.  Models whose config is gone are left out; so are errored models from the count.  ``known``:
-- the names of the models whose config the caller has, comma-separated (names have no commas).
local function stream_state(models_key, leader_key, model_prefix, ckpt_prefix, trace_prefix, known_csv, me, my_obs)
  local names = redis.call('SMEMBERS', models_key)
  table.sort(names)
  local known = {}
  for m in string.gmatch(known_csv, '[^,]+') do known[m] = true end
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
