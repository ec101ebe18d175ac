-- The stream's state for its posterior (workers/store/commit.py).  Prepended with stream_state.lua.
-- KEYS: stream models, leader.  ARGV: key prefixes of model configs, checkpoints, traces; the known
-- names, comma-separated.  Returns {'same'} or {'moved', <stream state>}.  Writes nothing.
local view = stream_state(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], '', 0)
if view then return {'moved', unpack(view)} end
return {'same'}
