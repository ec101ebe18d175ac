-- Fenced compare-and-set of a stream's leader record (workers/store/commit.py).
-- KEYS: lease, leader, alerts, alerts_total.  ARGV: token, the leader record read ('' = none),
-- the new record, events channel, posterior event ('' = none), alert kind ('' = no alert), alert
-- JSON, alert event JSON, alert score.  Returns 'lost' or 'stale' (nothing written), or 'ok'.
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
