-- The cold tier's count of a topic's messages in the message log only (meta's cold), and the same
-- messages per hour they fall due in (the cold_hours hash, which getTopicInfo's waiting buckets
-- read): each script that moves one in or out keeps both, while the count is there (the loader
-- drops both once none is left). A sharded topic's shards each keep a signed part of the topic's
-- count (raise_hot.lua), which readers add up: a message may go cold in one shard and be loaded
-- into another, after a reshard.
-- live_count(t, meta key) -> the topic's live messages, the count its live-message caps hold: those
--   in its queues (each live message Redis holds is in exactly one) and the cold ones
--   t: waiting, ready, prioritised, inflight (keys)
-- cold_added(meta key, hours key, trigger_time): a message went to the log only
-- cold_moved(meta key, hours key, by_hour) -> how many it counted out: messages left the log only
--   (into Redis, or deleted there), by_hour[hour] of them due in each hour (hours_of). A count that
--   is the topic's own (no meta signed) goes no lower than 0, nor does an hour's: what it would take
--   below was never counted in (a send that died between its log row and its script), and would
--   hide as many cold messages sent later
-- hours_of(trigger_times) -> by_hour, for cold_moved
-- signed_part(meta key): the shard of a sharded topic keeps a signed part of the count (from 0 if it had
--   none): a shard its loader has not worked since a reshard counts out a message another shard counted in
-- own_count(meta key, hours key): a signed part becomes the topic's own count (a topic shrunk to one
--   shard): an hour the parts left below 0 (counted out, never in) is dropped, and what it took off the
--   count is given back, so that neither hides a message sent cold later (readers clamped the hour at 0)
local function live_count(t, meta)
  return redis.call('ZCARD', t.waiting) + redis.call('LLEN', t.ready) + redis.call('ZCARD', t.prioritised)
    + redis.call('ZCARD', t.inflight) + math.max(tonumber(redis.call('HGET', meta, META.COLD) or '0'), 0)
end

local function cold_hour(trigger_time)
  return math.floor(trigger_time / COLD_HOUR_MILLIS)
end

local function cold_added(meta, hours, trigger_time)
  redis.call('HINCRBY', meta, META.COLD, 1)
  redis.call('HINCRBY', hours, cold_hour(trigger_time), 1)
end

local function hours_of(trigger_times)
  local by_hour = {}
  for _, trigger_time in ipairs(trigger_times) do
    local hour = cold_hour(trigger_time)
    by_hour[hour] = (by_hour[hour] or 0) + 1
  end
  return by_hour
end

local function signed_part(meta)
  redis.call('HSETNX', meta, META.COLD, 0)
  redis.call('HSET', meta, META.SIGNED, 1)
end

local function own_count(meta, hours)
  if redis.call('HDEL', meta, META.SIGNED) == 0 then
    return
  end
  local held, never_in = redis.call('HGETALL', hours), 0
  for i = 1, #held, 2 do
    local n = tonumber(held[i + 1])
    if n < 0 then
      never_in = never_in - n
      redis.call('HDEL', hours, held[i])
    end
  end
  local cold = redis.call('HGET', meta, META.COLD)
  if cold then
    redis.call('HSET', meta, META.COLD, math.max(tonumber(cold) + never_in, 0))
  end
end

local function cold_moved(meta, hours, by_hour)
  if next(by_hour) == nil or redis.call('HEXISTS', meta, META.COLD) == 0 then
    return 0
  end
  local signed = redis.call('HGET', meta, META.SIGNED) == '1'
  local moved = 0
  for hour, count in pairs(by_hour) do
    local left = redis.call('HINCRBY', hours, hour, -count)
    if left < 0 and not signed then
      count, left = math.max(count + left, 0), 0
    end
    if left == 0 then  -- a shard's part may be below 0: another shard's makes it up
      redis.call('HDEL', hours, hour)
    end
    moved = moved + count
  end
  if moved == 0 then
    return 0
  end
  local cold = redis.call('HINCRBY', meta, META.COLD, -moved)
  if cold < 0 and not signed then
    redis.call('HSET', meta, META.COLD, 0)
    moved = math.max(moved + cold, 0)
  end
  return moved
end
