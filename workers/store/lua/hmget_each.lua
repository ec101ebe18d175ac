-- HMGET of the same fields from several hashes in one call (workers/store/reads.py: stream_status; a pipelined HMGET
-- per model cost about 17 us per model in redis-py's asyncio client: python bench/api_scaling.py).  ARGV: the key
-- prefix, the number of fields n, the n fields, then the key suffixes (model names).  Returns one list of n values
-- (nil: none) per name.
local prefix, n = ARGV[1], tonumber(ARGV[2])
local fields = {unpack(ARGV, 3, 2 + n)}
local out = {}
for i = 3 + n, #ARGV do
  out[#out + 1] = redis.call('HMGET', prefix .. ARGV[i], unpack(fields))
end
return out
