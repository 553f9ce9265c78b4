-- The loader (workers/loader.py) found no cold message of the topic left in the message log: the
-- count of cold messages goes (and its hours), unless it moved since the loader read it (a send may have gone cold
-- after the loader's read). A topic keeps the count while it may have messages out of Redis, and is
-- not retired while it does.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- KEYS[3] packed
-- ARGV[1] cold: the count as the loader left it before it looked at the log
-- ARGV[2] forget_window: 1 drops hot_until and loaded_to too (the cold tier was switched off)
-- Returns 1 if cleared.
local meta = KEYS[1]
if (redis.call('HGET', meta, META.COLD) or '0') ~= ARGV[1] or redis.call('EXISTS', KEYS[3]) == 1 then
  return 0  -- packed messages count as cold until the scanner moves their lists in
end
redis.call('HDEL', meta, META.COLD)
redis.call('DEL', KEYS[2])
if ARGV[2] == '1' then
  redis.call('HDEL', meta, META.HOT_UNTIL, META.LOADED_TO, META.FETCHED_TO, META.SIGNED)
end
return 1
