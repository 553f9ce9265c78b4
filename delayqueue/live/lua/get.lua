-- Reads one message. A live message already past its TTL is ended first (5 or 6), so a
-- reader never sees a live status the scanner simply has not reached yet.
-- KEYS: waiting, ready, inflight, msgs, expiry, ended, stats, events
-- ARGV: msgId, retentionMillis, statsIntervalMillis, actor
-- Returns the message json, or nil.
-- @include common
local waiting, ready, inflight, msgs, expiry, ended, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
EVENTS, ACTOR = KEYS[8], ARGV[4]
local id = ARGV[1]
local interval = tonumber(ARGV[3])
local now = clock()
local raw = redis.call('HGET', msgs, id)
if not raw then
  return nil
end
local m = cjson.decode(raw)
if is_live(m) and m.expireTime <= now then
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', inflight, id)
  if m.status == 2 then
    redis.call('LREM', ready, -1, id)
  end
  end_message(msgs, expiry, ended, id, m, now, tonumber(ARGV[2]), 'expired')
  stat_add(stats, interval, now, 'triggerMsgEndLife', 1)
  raw = cjson.encode(m)
end
stat_add(stats, interval, now, 'getMsg', 1)
return raw
