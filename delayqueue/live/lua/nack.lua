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
-- @include take_consuming
-- @include end_message
-- @include set_ready
local t = {inflight = KEYS[1], ready = KEYS[2], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], stats = KEYS[6],
           meta = KEYS[7], events = KEYS[8], actor = ARGV[6], retention = tonumber(ARGV[2])}
local id = ARGV[1]
local interval = tonumber(ARGV[3])
local now = clock()
local m, status = take_consuming(t, interval, now, id)
if not m then
  return status
end
if m.expireTime <= now or m.retry > m.maxRetry then
  stat_add(t.stats, interval, now, 'triggerMsgEndLife', 1)
  return end_message(t, id, m, now, end_reason(m, now), STATUS.EXHAUSTED)
end
if set_ready(t, id, m, STATUS.CONSUMING, REASON.NACKED) == 1 then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return STATUS.READY
