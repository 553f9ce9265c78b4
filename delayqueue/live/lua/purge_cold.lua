-- purgeTopic in the cold tier, once it has ended the topic's cold rows in the message log (those
-- after the loader's loaded_to that Redis does not hold): counts them out of the cold count and
-- into the monitor counters as deletes, and fences the loader. loaded_to keeps its position and
-- gets a new fence number after it, so a page a loader read before those rows were ended loads
-- nothing (load_cold.lua finds loaded_to moved) and is read again, without them.
-- KEYS[1] meta
-- KEYS[2] stats
-- KEYS[3] cold_hours
-- KEYS[4] packed
-- ARGV[1] purged: cold messages the log ended
-- ARGV[2] stats_interval_millis
-- ARGV[3] signed: 1 for a shard of a sharded topic (the count they are out of: includes/cold_count.lua's
-- signed_part)
-- ARGV[4...] per hour: hour, count
-- (of the purged, count were due in hour: triggerTime // COLD_HOUR_MILLIS)
-- Returns the new loaded_to ('' if the topic has none).
-- @include clock
-- @include stats
-- @include cold_count
-- @include packed
local meta = KEYS[1]
local purged = tonumber(ARGV[1])
local loaded_to = redis.call('HGET', meta, META.LOADED_TO)
if loaded_to then
  local trigger_time, row_id, fence = string.match(loaded_to, '^([^:]*):([^:]*):?(%d*)$')
  loaded_to = trigger_time .. ':' .. row_id .. ':' .. ((tonumber(fence) or 0) + 1)
  redis.call('HSET', meta, META.LOADED_TO, loaded_to)
end
drop_packed({packed = KEYS[4], meta = meta})  -- their rows, after loaded_to, were among those ended
-- A page a loader brought in while its rows were being ended was counted out as it came in: a
-- topic's own count goes no lower than 0 (cold_moved), a shard's signed part by all of them.
local by_hour = {}
for i = 4, #ARGV, 2 do
  by_hour[ARGV[i]] = tonumber(ARGV[i + 1])
end
if ARGV[3] == '1' and next(by_hour) then
  signed_part(meta)
end
cold_moved(meta, KEYS[3], by_hour)
if purged > 0 then
  stat_add(KEYS[2], tonumber(ARGV[2]), clock(), COUNTER.DELETE, purged)
end
return loaded_to or ''
