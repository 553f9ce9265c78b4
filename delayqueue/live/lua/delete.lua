-- Deletes a live message: status 7 and out of every queue structure at once; with release
-- the body goes too. A missing, ended or expired message is not deleted (returns 0), but
-- release still frees an ended body.
-- KEYS: waiting, ready, inflight, msgs, expiry, ended, stats, events
-- ARGV: msgId, release (1|0), retentionMillis, statsIntervalMillis, actor
-- Returns 1 when a live message was deleted, else 0.
-- @include common
local waiting, ready, inflight, msgs, expiry, ended, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
EVENTS, ACTOR = KEYS[8], ARGV[5]
local id = ARGV[1]
local release = ARGV[2] == '1'
local retention = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])
local now = clock()
local raw = redis.call('HGET', msgs, id)
if not raw then
  return 0
end
local m = cjson.decode(raw)
local deleted = 0
if is_live(m) then
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', inflight, id)
  if m.status == 2 then
    redis.call('LREM', ready, -1, id)
  end
  if m.expireTime <= now then
    end_message(msgs, expiry, ended, id, m, now, retention, 'expired')
    stat_add(stats, interval, now, 'triggerMsgEndLife', 1)
  else
    end_message(msgs, expiry, ended, id, m, now, retention, 'deleted', 7)
    stat_add(stats, interval, now, 'deleteMsg', 1)
    deleted = 1
  end
end
if release then
  redis.call('HDEL', msgs, id)
  redis.call('ZREM', ended, id)
end
return deleted
