-- A retired shard count hands its shards' parts of the topic's count of cold messages on
-- (workers/scanner.py): a shard's part goes (and its hours), unless it moved since the scanner read
-- it (a send may have gone cold after the read), or a packed list is left.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- KEYS[3] packed
-- ARGV[1] cold: the part as the scanner read it
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
