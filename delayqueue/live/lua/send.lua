-- Accepts one message: waiting if it is not yet due, ready otherwise. A live duplicate
-- msgId enqueues nothing and returns the stored message; an ended one starts afresh.
-- produceTime comes from the caller, which wrote the same times to the message log first,
-- with the 'sent' history row (so this script records no event).
-- KEYS: waiting, ready, inflight, msgs, expiry, ended, meta, stats
-- ARGV: msgId, payload, delayMillis, ttlMillis, maxRetry, topic, readyChannel,
--       scheduleChannel, statsIntervalMillis, produceTime
-- Returns {1, status, newTopic (1|0)} when created (the caller has the rest of the message),
-- or {0, stored message json, newTopic (1|0)} for a live duplicate.
-- @include common
local waiting, ready, inflight, msgs, expiry, ended, meta, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local id, topic = ARGV[1], ARGV[6]
local interval = tonumber(ARGV[9])
local now, now_us = clock()

redis.call('HSET', meta, 'last_active', now)
local new_topic = redis.call('HSETNX', meta, 'registered', 1)
stat_add(stats, interval, now, 'sendMsg', 1)

local existing = redis.call('HGET', msgs, id)
if existing then
  local old = cjson.decode(existing)
  if is_live(old) and old.expireTime > now then
    return {0, existing, new_topic}
  end
  redis.call('ZREM', ended, id)
  redis.call('ZREM', waiting, id)
  redis.call('ZREM', inflight, id)
  redis.call('ZREM', expiry, id)
  if old.status == 2 then
    redis.call('LREM', ready, -1, id)
  end
end

local delay = tonumber(ARGV[3])
if delay < 0 then
  delay = 0
end
local produce = tonumber(ARGV[10])
local trigger = produce + delay
local m = {
  topic = topic,
  msgId = id,
  msg = ARGV[2],
  produceTime = produce,
  triggerTime = trigger,
  expireTime = trigger + tonumber(ARGV[4]),
  maxRetry = tonumber(ARGV[5]),
  retry = 0,
  status = (trigger <= now) and 2 or 1,
}
local encoded = cjson.encode(m)
redis.call('HSET', msgs, id, encoded)

-- Wake the scanner that owns this topic when this message is due or expires before
-- anything it is already sleeping towards.
local wake = next_due(expiry, now_us)
wake = (wake < 0) or ((m.expireTime - now) * 1000 < wake)
redis.call('ZADD', expiry, m.expireTime, id)
if m.status == 2 then
  push_ready(ready, ARGV[7], topic, id)
else
  local due = next_due(waiting, now_us)
  wake = wake or due < 0 or (trigger - now) * 1000 < due
  redis.call('ZADD', waiting, trigger, id)
end
if wake then
  redis.call('PUBLISH', ARGV[8], topic)
end
return {1, m.status, new_topic}
