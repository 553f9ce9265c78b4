-- The loader (workers/loader.py): raises the topic's hot_until (never lowers it) before it reads
-- the message log, so a send due by then goes to Redis from now on, and every send left in the log
-- only was committed before this and is in what the loader reads next. A topic without one yet
-- sent every message so far to Redis: it starts out loaded up to its new hot_until.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- ARGV[1] hot_until: ms
-- ARGV[2] loaded_to: the loaded_to of a topic that had no hot_until
-- ARGV[3] start: 1 gives a topic without a hot_until one; 0 leaves it without (the cold tier is off)
-- ARGV[4] signed: 1 for a shard of a sharded topic, whose count of cold messages is kept from here on,
-- at 0 when there is none: a message goes cold in one shard and may be loaded into another (after
-- a reshard), so each shard's count is a signed part of the topic's (includes/cold_count.lua), as the
-- meta's signed says; 0 removes that mark: the count is the topic's own, which goes no lower than 0
-- (own_count)
-- ARGV[5] fetched_to: '' or the fetched_to of a topic that had no hot_until, from where its sends
-- may be packed (includes/packed.lua): one that holds every message in Redis may pack a send
-- due after its loaded_to and before this
-- Returns {hot_until, the loader's position (fetched_to, else loaded_to), cold}: what the meta holds
-- now ('' for none).
-- @include cold_count
local meta = KEYS[1]
local hot = redis.call('HGET', meta, META.HOT_UNTIL)
if not hot and ARGV[3] ~= '1' then
  return {'', '', ''}
end
if not hot then
  redis.call('HSET', meta, META.HOT_UNTIL, ARGV[1], META.LOADED_TO, ARGV[2])
  if ARGV[5] ~= '' then
    redis.call('HSET', meta, META.FETCHED_TO, ARGV[5])
  end
elseif tonumber(ARGV[1]) > tonumber(hot) then
  redis.call('HSET', meta, META.HOT_UNTIL, ARGV[1])
end
if ARGV[4] == '1' then
  signed_part(meta)
else
  own_count(meta, KEYS[2])
end
local values = redis.call('HMGET', meta, META.HOT_UNTIL, META.FETCHED_TO, META.LOADED_TO, META.COLD)
return {values[1], values[2] or values[3], values[4] or ''}
