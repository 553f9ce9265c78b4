-- Marks a consuming message as acked. Any other state is left alone.
-- KEYS[1] inflight
-- KEYS[2] msgs
-- KEYS[3] expiry
-- KEYS[4] ended
-- KEYS[5] stats
-- KEYS[6] meta
-- KEYS[7] events
-- ARGV[1] msg_id
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- Returns the message's status after the call, or 0 if it is unknown.
-- @include clock
-- @include stats
-- @include end_message
local t = {inflight = KEYS[1], msgs = KEYS[2], expiry = KEYS[3], ended = KEYS[4], events = KEYS[7],
           actor = ARGV[4], retention = tonumber(ARGV[2])}
local stats, meta = KEYS[5], KEYS[6]
local id = ARGV[1]
local now = clock()
redis.call('HSET', meta, 'last_active', now)
stat_add(stats, tonumber(ARGV[3]), now, 'ackMsg', 1)
local raw = redis.call('HGET', t.msgs, id)
if not raw then
  return 0
end
local m = cjson.decode(raw)
if m.status ~= STATUS.CONSUMING then
  return m.status
end
redis.call('ZREM', t.inflight, id)
return end_message(t, id, m, now, REASON.ACKED, STATUS.ACKED)
