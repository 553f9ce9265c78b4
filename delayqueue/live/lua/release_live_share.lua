-- Shrinks a topic's share of its namespace's live-message cap to the live messages it holds,
-- so the caller can give the rest back to the namespace's pool (borrow_live.lua).
-- KEYS[1] expiry
-- KEYS[2] meta
-- Returns the room released.
-- @include cold_count
local live = live_count(KEYS[1], KEYS[2])
local share = tonumber(redis.call('HGET', KEYS[2], META.LIVE_SHARE) or '0')
if share <= live then
  return 0
end
redis.call('HSET', KEYS[2], META.LIVE_SHARE, live)
return share - live
