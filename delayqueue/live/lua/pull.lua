-- Takes up to `batch` messages from the ready list, oldest first, and puts them in flight with
-- an ack deadline. A message found past its TTL or out of deliveries is ended instead of
-- returned.
-- KEYS[1] ready
-- KEYS[2] inflight
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] meta
-- KEYS[8] events
-- ARGV[1] batch: most messages returned
-- ARGV[2] ack_timeout_millis
-- ARGV[3] retention_millis: how long an ended body stays readable
-- ARGV[4] stats_interval_millis
-- ARGV[5] schedule_channel: published when the ack deadline is earlier than the scanner expects
-- ARGV[6] topic
-- ARGV[7] actor: 'process@host' for the history, '' with the message log off
-- Returns {messages left in ready, json1, json2, ...}
-- @include clock
-- @include stats
-- @include status
-- @include end_message
-- @include next_due
local t = {msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[8], actor = ARGV[7],
           retention = tonumber(ARGV[3])}
local ready, inflight, stats, meta = KEYS[1], KEYS[2], KEYS[6], KEYS[7]
local batch = tonumber(ARGV[1])
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
  local raw = redis.call('HGET', t.msgs, id)
  if raw then
    local m = cjson.decode(raw)
    if is_live(m) then
      if m.expireTime <= now or m.retry > m.maxRetry then
        end_message(t, id, m, now, end_reason(m, now))
        ended_count = ended_count + 1
      else
        m.status = STATUS.CONSUMING
        m.retry = m.retry + 1
        local encoded = cjson.encode(m)
        redis.call('HSET', t.msgs, id, encoded)
        redis.call('ZADD', inflight, deadline, id)
        log_event(t.events, t.actor, id, m, STATUS.READY, REASON.PULLED)
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
