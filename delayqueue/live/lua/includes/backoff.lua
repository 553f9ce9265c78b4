-- Retry backoff: how long a message given back (ack timeout, nack) waits before it is ready
-- again, from its topic's settings mirrored in the meta hash (stores/topic_settings.py):
-- min(max, base * 2^(retry-1)), less up to RETRY_BACKOFF_JITTER of it at random; 0 when the
-- topic has none. Redis seeds math.random alike for every call, so the caller seeds it from
-- ARGV first (math.randomseed).
-- backoff_settings(meta key) -> base ms, max ms (read once per call)
-- backoff_wait(base ms, max ms, retry: deliveries so far) -> ms to wait
local function backoff_settings(meta)
  local fields = redis.call('HMGET', meta, META.RETRY_BACKOFF, META.RETRY_BACKOFF_MAX)
  return tonumber(fields[1] or '0'), tonumber(fields[2] or RETRY_BACKOFF_MAX_MILLIS)
end

local function backoff_wait(base, max, retry)
  if base <= 0 then
    return 0
  end
  -- The exponent is bounded so that the product stays an exact number.
  local wait = math.min(max, base * 2 ^ math.min(math.max(retry - 1, 0), 40))
  return math.floor(wait - wait * RETRY_BACKOFF_JITTER * math.random())
end
