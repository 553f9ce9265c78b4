-- Raises a topic's share of its namespace's live-message cap to the live messages it holds
-- (messages restored from the log come back without one), for the count of every topic's
-- share that a namespace's new pool starts from (borrow_live.lua).
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] prioritised
-- KEYS[4] inflight
-- KEYS[5] meta
-- Returns the topic's share now.
-- @include cold_count
local live = live_count({waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[3], inflight = KEYS[4]}, KEYS[5])
local share = tonumber(redis.call('HGET', KEYS[5], META.LIVE_SHARE) or '0')
if live > share then
  redis.call('HSET', KEYS[5], META.LIVE_SHARE, live)
  return live
end
return share
