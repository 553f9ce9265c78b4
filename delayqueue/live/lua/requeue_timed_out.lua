-- Scanner: a consuming message whose ack deadline passed goes back to ready and wakes long
-- pollers; with no deliveries or TTL left it is ended (exhausted) instead.
-- KEYS[1] inflight
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
-- Returns {requeued, µs until the next ack deadline (0: more due now, -1: none)}
-- @include clock
-- @include stats
-- @include end_message
-- @include scan_reply
local t = {inflight = KEYS[1], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[7],
           actor = ARGV[6], retention = tonumber(ARGV[2])}
local ready, stats = KEYS[2], KEYS[6]
local limit = tonumber(ARGV[1])
local interval = tonumber(ARGV[3])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', t.inflight, '-inf', now, 'LIMIT', 0, limit)
local requeued, ended_count = 0, 0
local was_empty = redis.call('LLEN', ready) == 0
for _, id in ipairs(ids) do
  redis.call('ZREM', t.inflight, id)
  local raw = redis.call('HGET', t.msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if m.status == STATUS.CONSUMING then
      if m.expireTime <= now or m.retry > m.maxRetry then
        end_message(t, id, m, now, end_reason(m, now), STATUS.EXHAUSTED)
        ended_count = ended_count + 1
      else
        m.status = STATUS.READY
        redis.call('HSET', t.msgs, id, cjson.encode(m))
        redis.call('LPUSH', ready, id)
        log_event(t.events, t.actor, id, m, STATUS.CONSUMING, REASON.ACK_TIMEOUT)
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
return scan_reply(requeued, #ids, limit, t.inflight)
