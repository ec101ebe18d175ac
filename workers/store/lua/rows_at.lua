-- Each listed model's last trace row starting before observation ARGV[2] (ZREVRANGEBYSCORE trace count-1 -inf
-- LIMIT 0 1; workers/store/records.py: row_covering), one call for all of them (workers/store/reads.py).
-- ARGV: the key prefix of traces, the count, the model names.  Returns the rows in that order (none: nil).
local out, c = {}, tonumber(ARGV[2]) - 1
for i = 3, #ARGV do
  out[i - 2] = redis.call('ZREVRANGEBYSCORE', ARGV[1] .. ARGV[i], c, '-inf', 'LIMIT', 0, 1)[1] or false
end
return out
