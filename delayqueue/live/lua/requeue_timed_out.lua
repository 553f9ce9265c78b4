-- Scanner: a consuming message whose ack deadline passed goes back to ready (3 -> 2) and
-- wakes long pollers; with no deliveries or TTL left it is ended (6) instead.
-- KEYS: inflight, ready, msgs, expiry, ended, stats, events
-- ARGV: limit, retentionMillis, statsIntervalMillis, readyChannel, topic, actor
-- Returns {requeued, µs until the next ack deadline (0: more due now, -1: none)}
-- @include common
local inflight, ready, msgs, expiry, ended, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
EVENTS, ACTOR = KEYS[7], ARGV[6]
local limit = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', inflight, '-inf', now, 'LIMIT', 0, limit)
local requeued, ended_count = 0, 0
local was_empty = redis.call('LLEN', ready) == 0
for _, id in ipairs(ids) do
  redis.call('ZREM', inflight, id)
  local raw = redis.call('HGET', msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if m.status == 3 then
      if m.expireTime <= now or m.retry > m.maxRetry then
        end_message(msgs, expiry, ended, id, m, now, retention, end_reason(m, now), 6)
        ended_count = ended_count + 1
      else
        m.status = 2
        redis.call('HSET', msgs, id, cjson.encode(m))
        redis.call('LPUSH', ready, id)
        log_event(id, m, 3, 'ack_timeout')
        requeued = requeued + 1
      end
    end
  end
end
if requeued > 0 and was_empty then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
stat_add(stats, interval, now, 'triggerMsgTimeout', requeued)
stat_add(stats, interval, now, 'triggerMsgEndLife', ended_count)
if #ids == limit then
  return {requeued, 0}
end
-- The clock again: the loop above may have taken a while, and the scanner sleeps on this.
return {requeued, next_due(inflight, select(2, clock()))}
