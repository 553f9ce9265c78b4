-- Takes up to `batch` messages from the ready list, oldest first, and puts them in flight
-- with an ack deadline. A message found past its TTL or out of deliveries is ended
-- (5 or 6) instead of returned.
-- KEYS: ready, inflight, msgs, expiry, ended, stats, meta, events
-- ARGV: batch, ackTimeoutMillis, retentionMillis, statsIntervalMillis, scheduleChannel, topic, actor
-- Returns {messages left in ready, json1, json2, ...}
-- @include common
local ready, inflight, msgs, expiry, ended, stats, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
EVENTS, ACTOR = KEYS[8], ARGV[7]
local batch = tonumber(ARGV[1])
local retention = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])
local now, now_us = clock()
local deadline = now + tonumber(ARGV[2])
local earliest_deadline = next_due(inflight, now_us)

redis.call('HSET', meta, 'last_active', now)
local out = {0}
local ended_count = 0
-- Bounded so that a list of stale ids cannot hold the script for long.
local budget = batch + 1000
while #out <= batch and budget > 0 do
  budget = budget - 1
  local id = redis.call('RPOP', ready)
  if not id then
    break
  end
  local raw = redis.call('HGET', msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if is_live(m) then
      if m.expireTime <= now or m.retry > m.maxRetry then
        end_message(msgs, expiry, ended, id, m, now, retention, end_reason(m, now))
        ended_count = ended_count + 1
      else
        m.status = 3
        m.retry = m.retry + 1
        local encoded = cjson.encode(m)
        redis.call('HSET', msgs, id, encoded)
        redis.call('ZADD', inflight, deadline, id)
        log_event(id, m, 2, 'pulled')
        out[#out + 1] = encoded
        stat_gap(stats, interval, now, 'pullGap', now - m.triggerTime)
      end
    end
  end
end

local pulled = #out - 1
stat_add(stats, interval, now, 'pullMsg', pulled)
stat_add(stats, interval, now, 'triggerMsgEndLife', ended_count)
if pulled > 0 and (earliest_deadline < 0 or (deadline - now) * 1000 < earliest_deadline) then
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
out[1] = redis.call('LLEN', ready)
return out
