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
-- cold_moved(meta key, hours key, n, by_hour): n messages left the log only (into Redis, or deleted
--   there), by_hour[hour] of them due in each hour (hours_of)
-- hours_of(trigger_times) -> by_hour, for cold_moved
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

local function cold_moved(meta, hours, n, by_hour)
  if n > 0 and redis.call('HEXISTS', meta, META.COLD) == 1 then
    redis.call('HINCRBY', meta, META.COLD, -n)
    for hour, count in pairs(by_hour) do
      if redis.call('HINCRBY', hours, hour, -count) == 0 then  -- below 0 in a shard another one makes up
        redis.call('HDEL', hours, hour)
      end
    end
  end
end
