-- A consumer extends a consuming message's ack deadline to now + ack_timeout_millis (Redis'
-- clock). Any other state is left alone.
-- KEYS[1] inflight
-- KEYS[2] msgs
-- KEYS[3] meta
-- KEYS[4] events
-- ARGV[1] msg_id
-- ARGV[2] ack_timeout_millis
-- ARGV[3] schedule_channel: published when the new deadline is earlier than the scanner expects
-- ARGV[4] topic
-- ARGV[5] actor: 'process@host' for the history, '' with the message log off
-- ARGV[6] retry: '' or the retry of the delivery it extends (one delivered again since is left alone)
-- Returns {1, the new ack deadline (epoch ms)} when it was consuming (under that retry, when given),
-- else {0, its status (0: unknown), its retry}.
-- @include clock
-- @include history
-- @include next_due
-- @include stored
local inflight, msgs, meta, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local now, now_us = clock()
local raw = redis.call('HGET', msgs, id)
if not raw then
  return {0, 0, 0}
end
local m = decode_stored(raw, id)
if m.status ~= STATUS.CONSUMING or (ARGV[6] ~= '' and tonumber(ARGV[6]) ~= m.retry) then
  return {0, m.status, m.retry}
end
redis.call('HSET', meta, META.LAST_ACTIVE, now)
local deadline = now + tonumber(ARGV[2])
local earliest = next_due(inflight, now_us)
redis.call('ZADD', inflight, deadline, id)
log_event(events, ARGV[5], id, m, STATUS.CONSUMING, REASON.TOUCHED)
if earliest < 0 or (deadline - now) * 1000 < earliest then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return {1, deadline}
