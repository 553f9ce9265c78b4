-- How many more live messages a topic needs room for, beyond its share of its namespace's
-- live-message cap, to take `wanted` more. The share is the room this topic holds of the cap
-- (borrow_live.lua hands it out); send.lua refuses a message that would pass it.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] prioritised
-- KEYS[4] inflight
-- KEYS[5] meta
-- ARGV[1] wanted
-- Returns the shortfall, 0 when the share has room for all of them.
-- @include cold_count
local live = live_count({waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[3], inflight = KEYS[4]}, KEYS[5])
local share = tonumber(redis.call('HGET', KEYS[5], META.LIVE_SHARE) or '0')
return math.max(live + tonumber(ARGV[1]) - share, 0)
