-- Scanner: moves due waiting messages to ready in triggerTime order and wakes long pollers. One
-- already past its TTL is ended (expired) instead.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] events
-- ARGV[1] limit: most messages handled per call
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[5] topic
-- ARGV[6] actor: 'process@host' for the history, '' with the message log off
-- Returns {moved, µs until the next due message (0: more due now, -1: none)}
-- @include clock
-- @include stats
-- @include lateness
-- @include end_message
-- @include scan_reply
local t = {waiting = KEYS[1], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[7],
           actor = ARGV[6], retention = tonumber(ARGV[2])}
local ready, stats = KEYS[2], KEYS[6]
local limit = tonumber(ARGV[1])
local interval = tonumber(ARGV[3])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', t.waiting, '-inf', now, 'LIMIT', 0, limit)
local moved, ended_count = 0, 0
local lateness = {}
local was_empty = redis.call('LLEN', ready) == 0
for _, id in ipairs(ids) do
  redis.call('ZREM', t.waiting, id)
  local raw = redis.call('HGET', t.msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if m.status == STATUS.WAITING then
      if m.expireTime <= now then
        end_message(t, id, m, now, REASON.EXPIRED)
        ended_count = ended_count + 1
      else
        m.status = STATUS.READY
        redis.call('HSET', t.msgs, id, cjson.encode(m))
        redis.call('LPUSH', ready, id)
        log_event(t.events, t.actor, id, m, STATUS.WAITING, REASON.DUE)
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
return scan_reply(moved, #ids, limit, t.waiting)
