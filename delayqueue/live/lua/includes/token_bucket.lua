-- Token buckets for the rate limits: `rate` tokens a second, holding at most BURST_MILLIS'
-- worth. Bucket `kind` (a BUCKET) is two fields of a hash: '<kind>:tokens' and
-- '<kind>:at' (µs of the last take). A bucket left alone for BURST_MILLIS is full, so the hash
-- expires then and a missing one reads as full (an idle topic leaves nothing behind).
-- bucket_level(key, kind, rate, now µs) -> tokens now
-- bucket_store(key, kind, tokens, now µs)
-- bucket_wait(tokens, wanted, rate) -> ms until the bucket holds `wanted` (at most a full one)
local function bucket_level(key, kind, rate, now_us)
  local capacity = rate * BURST_MILLIS / 1000
  local saved = redis.call('HMGET', key, kind .. ':tokens', kind .. ':at')
  local tokens, at = tonumber(saved[1]), tonumber(saved[2])
  if not tokens or not at then
    return capacity
  end
  return math.min(capacity, tokens + math.max(now_us - at, 0) * rate / 1000000)
end

local function bucket_store(key, kind, tokens, now_us)
  -- Formatted: Lua's own number-to-string keeps 14 digits, too few for µs since the epoch.
  redis.call('HSET', key, kind .. ':tokens', string.format('%.6f', tokens), kind .. ':at', string.format('%.0f', now_us))
  redis.call('PEXPIRE', key, BURST_MILLIS)
end

local function bucket_wait(tokens, wanted, rate)
  local target = math.min(wanted, rate * BURST_MILLIS / 1000)
  return math.max(math.ceil((target - tokens) * 1000 / rate), 1)
end
