-- Adds room borrowed from the namespace's pool (borrow_live.lua) to a topic's share of its
-- namespace's live-message cap.
-- KEYS[1] meta
-- ARGV[1] amount
-- Returns the topic's share now.
return redis.call('HINCRBY', KEYS[1], META.LIVE_SHARE, tonumber(ARGV[1]))
