-- Marks a consuming message as acked (4). Any other state is left alone.
-- KEYS: inflight, msgs, expiry, ended, stats, meta, events
-- ARGV: msgId, retentionMillis, statsIntervalMillis, actor
-- Returns the message's status after the call, or 0 if it is unknown.
-- @include common
local inflight, msgs, expiry, ended, stats, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
EVENTS, ACTOR = KEYS[7], ARGV[4]
local id = ARGV[1]
local now = clock()
redis.call('HSET', meta, 'last_active', now)
stat_add(stats, tonumber(ARGV[3]), now, 'ackMsg', 1)
local raw = redis.call('HGET', msgs, id)
if not raw then
  return 0
end
local m = cjson.decode(raw)
if m.status ~= 3 then
  return m.status
end
redis.call('ZREM', inflight, id)
return end_message(msgs, expiry, ended, id, m, now, tonumber(ARGV[2]), 'acked', 4)
