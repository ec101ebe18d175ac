-- Delete the lease KEYS[1] if it still holds the token ARGV[1].  Returns 1 deleted, 0 not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end
