-- Seq check + XADD + meta update in one atomic step: a rejected chunk leaves no trace
-- (workers/store/reads.py: ingest).
-- KEYS: meta, log, seqs.  ARGV: seq ("" = next), sha256, n, x_shape, y_shape, x, y.
-- Returns {status, seq, first_index, n}: status ok | duplicate | gap | conflict | missing.
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
