-- Gives a consuming message back (ack=false): ready again at once, or ended (6) when it
-- has no deliveries or TTL left. Any other state is left alone.
-- KEYS: inflight, ready, msgs, expiry, ended, stats, meta, events
-- ARGV: msgId, retentionMillis, statsIntervalMillis, readyChannel, topic, actor
-- Returns the message's status after the call, or 0 if it is unknown.
-- @include common
local inflight, ready, msgs, expiry, ended, stats, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
EVENTS, ACTOR = KEYS[8], ARGV[6]
local id = ARGV[1]
local interval = tonumber(ARGV[3])
local now = clock()
redis.call('HSET', meta, 'last_active', now)
stat_add(stats, interval, now, 'ackMsg', 1)
local raw = redis.call('HGET', msgs, id)
if not raw then
  return 0
end
local m = cjson.decode(raw)
if m.status ~= 3 then
  return m.status
end
redis.call('ZREM', inflight, id)
if m.expireTime <= now or m.retry > m.maxRetry then
  stat_add(stats, interval, now, 'triggerMsgEndLife', 1)
  return end_message(msgs, expiry, ended, id, m, now, tonumber(ARGV[2]), end_reason(m, now), 6)
end
m.status = 2
redis.call('HSET', msgs, id, cjson.encode(m))
log_event(id, m, 3, 'nacked')
push_ready(ready, ARGV[4], ARGV[5], id)
return 2
