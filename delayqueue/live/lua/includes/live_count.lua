-- A topic's live messages, the count its live-message caps hold: those Redis holds (its expiry
-- index has exactly them) and, in the cold tier, those in the message log only (meta's cold).
-- live_count(expiry key, meta key) -> count
local function live_count(expiry, meta)
  return redis.call('ZCARD', expiry) + math.max(tonumber(redis.call('HGET', meta, META.COLD) or '0'), 0)
end
