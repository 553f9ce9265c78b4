-- Scanner: ends live messages whose TTL passed (5 if never delivered, else 6) and takes
-- them out of whichever queue structure holds them.
-- KEYS: waiting, ready, inflight, msgs, expiry, ended, stats, events
-- ARGV: limit, retentionMillis, statsIntervalMillis, actor
-- Returns {expired, µs until the next expiry (0: more due now, -1: none)}
-- @include common
local waiting, ready, inflight, msgs, expiry, ended, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
EVENTS, ACTOR = KEYS[8], ARGV[4]
local limit = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, limit)
local expired = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', expiry, id)
  local raw = redis.call('HGET', msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if is_live(m) then
      if m.status == 1 then
        redis.call('ZREM', waiting, id)
      elseif m.status == 2 then
        -- The oldest ready ids sit at the tail, where LREM with a negative count starts.
        redis.call('LREM', ready, -1, id)
      else
        redis.call('ZREM', inflight, id)
      end
      end_message(msgs, expiry, ended, id, m, now, retention, 'expired')
      expired = expired + 1
    end
  end
end
stat_add(stats, tonumber(ARGV[3]), now, 'triggerMsgEndLife', expired)
if #ids == limit then
  return {expired, 0}
end
-- The clock again: the loop above may have taken a while, and the scanner sleeps on this.
return {expired, next_due(expiry, select(2, clock()))}
