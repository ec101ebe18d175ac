-- The stream posterior's inputs for the API (workers/store/reads.py: stream_posterior) in one call: reading them with
-- two commands per model cost 82-84 ms per request at 1,000 models (python bench/api_scaling.py).
-- KEYS: the stream's models set.  ARGV: the key prefixes of model configs and checkpoints.  Returns {names, configs,
-- observations, statuses, errors}, lists in the order of names (a missing config or field: nil).  Writes nothing.
local names = redis.call('SMEMBERS', KEYS[1])
local cfgs, obs, st, err = {}, {}, {}, {}
for i, m in ipairs(names) do
  cfgs[i] = redis.call('GET', ARGV[1] .. m)
  local v = redis.call('HMGET', ARGV[2] .. m, 'observations', 'status', 'error')
  obs[i], st[i], err[i] = v[1], v[2], v[3]
end
return {names, cfgs, obs, st, err}
