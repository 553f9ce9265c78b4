-- Shrinks a topic's share of its namespace's live-message cap to the live messages it holds,
-- so the caller can give the rest back to the namespace's pool (borrow_live.lua).
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] prioritised
-- KEYS[4] inflight
-- KEYS[5] meta
-- Returns the room released.
-- @include cold_count
local live = live_count({waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[3], inflight = KEYS[4]}, KEYS[5])
local share = tonumber(redis.call('HGET', KEYS[5], META.LIVE_SHARE) or '0')
if share <= live then
  return 0
end
redis.call('HSET', KEYS[5], META.LIVE_SHARE, live)
return share - live
