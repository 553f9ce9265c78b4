-- Gives a consuming message back (ack=false): ready again at once, or ended (exhausted) when it
-- has no deliveries or TTL left. Any other state is left alone.
-- KEYS[1] inflight
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] meta
-- KEYS[8] events
-- ARGV[1] msg_id
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[5] topic
-- ARGV[6] actor: 'process@host' for the history, '' with the message log off
-- Returns the message's status after the call, or 0 if it is unknown.
-- @include clock
-- @include stats
-- @include end_message
-- @include push_ready
local t = {inflight = KEYS[1], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[8],
           actor = ARGV[6], retention = tonumber(ARGV[2])}
local ready, stats, meta = KEYS[2], KEYS[6], KEYS[7]
local id = ARGV[1]
local interval = tonumber(ARGV[3])
local now = clock()
redis.call('HSET', meta, 'last_active', now)
stat_add(stats, interval, now, 'ackMsg', 1)
local raw = redis.call('HGET', t.msgs, id)
if not raw then
  return 0
end
local m = cjson.decode(raw)
if m.status ~= STATUS.CONSUMING then
  return m.status
end
redis.call('ZREM', t.inflight, id)
if m.expireTime <= now or m.retry > m.maxRetry then
  stat_add(stats, interval, now, 'triggerMsgEndLife', 1)
  return end_message(t, id, m, now, end_reason(m, now), STATUS.EXHAUSTED)
end
m.status = STATUS.READY
redis.call('HSET', t.msgs, id, cjson.encode(m))
log_event(t.events, t.actor, id, m, STATUS.CONSUMING, REASON.NACKED)
push_ready(ready, ARGV[4], ARGV[5], id)
return STATUS.READY
