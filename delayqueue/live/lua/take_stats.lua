-- A retired shard count's shard gives up its monitor counters (the scanner's retirement,
-- workers/scanner.py): they are answered, for fold_stats.lua to add into the topic's first
-- current shard, and deleted, so a count taken up again does not count them twice.
-- KEYS[1] stats
-- Returns the stats hash as HGETALL gives it.
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return fields
