-- The cold tier's count of a topic's messages in the message log only (meta's cold): each script
-- that moves one in or out keeps it, while it is there (the loader drops it once none is left).
-- live_count(expiry key, meta key) -> the topic's live messages, the count its live-message caps
--   hold: those Redis holds (its expiry index has exactly them) and the cold ones
-- cold_moved(meta key, n): n messages left the log only (into Redis, or deleted there)
local function live_count(expiry, meta)
  return redis.call('ZCARD', expiry) + math.max(tonumber(redis.call('HGET', meta, META.COLD) or '0'), 0)
end

local function cold_moved(meta, n)
  if n > 0 and redis.call('HEXISTS', meta, META.COLD) == 1 then
    redis.call('HINCRBY', meta, META.COLD, -n)
  end
end
