-- A shard's part of its topic's count of cold messages, looked at before it is taken away
-- (forget_cold.lua takes what this found): by the loader's step 4 (workers/loader.py), which found no
-- cold message of the topic left in the message log and looks at every shard's part before it drops
-- any, so it drops all or none (a sharded topic's signed parts add up only together;
-- includes/cold_count.lua).
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- KEYS[3] packed
-- ARGV[1] cold: the count as the loader left it before it looked at the log
-- Returns {the count, then the cold_hours hash (hour, count, ...)} if the count is still that and no
-- packed list is left, else nil: a message moved since (a send may have gone cold after the loader's
-- read), or is packed, counted cold until the scanner moves its list in.
local cold = redis.call('HGET', KEYS[1], META.COLD) or '0'
if cold ~= ARGV[1] or redis.call('EXISTS', KEYS[3]) == 1 then
  return false
end
local found = redis.call('HGETALL', KEYS[2])
table.insert(found, 1, cold)
return found
