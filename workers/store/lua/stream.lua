-- The stream's state for its posterior (workers/store/commit.py).  Prepended with stream_state.lua.
-- KEYS: stream models, leader.  ARGV: key prefixes of model configs, checkpoints, traces; n known
-- names and the names.  Returns {'same'} or {'moved', <stream state>}.  Writes nothing.
local known = {}
for i = 5, 4 + tonumber(ARGV[4]) do known[ARGV[i]] = true end
local view = stream_state(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], known, '', 0)
if view then return {'moved', unpack(view)} end
return {'same'}
