-- Takes away a shard's part of its topic's count of cold messages (the count and its hours) as
-- cold_part.lua found it, keeping what moved since (a send gone cold after the look, counted only
-- here), and drops the count once nothing is left: the loader's step 4 (workers/loader.py), once every
-- shard's part was as it left it after it found no cold message left in the message log.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- ARGV[1] cold: the part cold_part.lua found
-- ARGV[2] forget_window: 1 drops the window's fields too with the count (the cold tier was switched off)
-- ARGV[3...] per hour: hour, count
-- (the cold_hours cold_part.lua found)
-- Returns 1 if the count was dropped.
local meta, hours = KEYS[1], KEYS[2]
-- A topic's own count, and each of its hours, goes no lower than 0 (includes/cold_count.lua).
local signed = redis.call('HGET', meta, META.SIGNED) == '1'
for i = 3, #ARGV, 2 do
  local left = redis.call('HINCRBY', hours, ARGV[i], -tonumber(ARGV[i + 1]))
  if left == 0 or (left < 0 and not signed) then
    redis.call('HDEL', hours, ARGV[i])
  end
end
local cold = tonumber(redis.call('HGET', meta, META.COLD) or '0') - tonumber(ARGV[1])
if cold < 0 and not signed then
  cold = 0
end
if cold ~= 0 or redis.call('EXISTS', hours) == 1 then
  redis.call('HSET', meta, META.COLD, cold)
  return 0
end
redis.call('HDEL', meta, META.COLD)
if ARGV[2] == '1' then
  redis.call('HDEL', meta, META.HOT_UNTIL, META.LOADED_TO, META.FETCHED_TO, META.SIGNED)
end
return 1
