-- Renew every lease in KEYS that still holds its token (fenced: a lease taken over or deleted is left
-- alone).  ARGV: ttl (ms), then one token per key.  Returns one flag per key: 1 renewed, 0 lost.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
