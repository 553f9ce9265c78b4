-- Scanner: moves due waiting messages to ready (1 -> 2) in triggerTime order and wakes
-- long pollers. One already past its TTL is ended (5) instead.
-- KEYS: waiting, ready, msgs, expiry, ended, stats, events
-- ARGV: limit, retentionMillis, statsIntervalMillis, readyChannel, topic, actor
-- Returns {moved, µs until the next due message (0: more due now, -1: none)}
-- @include common
local waiting, ready, msgs, expiry, ended, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
EVENTS, ACTOR = KEYS[7], ARGV[6]
local limit = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', waiting, '-inf', now, 'LIMIT', 0, limit)
local moved, ended_count = 0, 0
local lateness = {}
local was_empty = redis.call('LLEN', ready) == 0
for _, id in ipairs(ids) do
  redis.call('ZREM', waiting, id)
  local raw = redis.call('HGET', msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if m.status == 1 then
      if m.expireTime <= now then
        end_message(msgs, expiry, ended, id, m, now, retention, 'expired')
        ended_count = ended_count + 1
      else
        m.status = 2
        redis.call('HSET', msgs, id, cjson.encode(m))
        redis.call('LPUSH', ready, id)
        log_event(id, m, 1, 'due')
        moved = moved + 1
        stat_gap(stats, interval, now, 'readyGap', now - m.triggerTime)
        lateness_add(lateness, now - m.triggerTime)
      end
    end
  end
end
if moved > 0 and was_empty then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
stat_add(stats, interval, now, 'triggerMsgReady', moved)
lateness_flush(stats, now, lateness)
stat_add(stats, interval, now, 'triggerMsgEndLife', ended_count)
if #ids == limit then
  return {moved, 0}
end
-- The clock again: the loop above may have taken a while, and the scanner sleeps on this.
return {moved, next_due(waiting, select(2, clock()))}
