-- Scanner: a consuming message whose ack deadline passed goes back to ready (at its priority) and
-- wakes long pollers; with no deliveries or TTL left it is ended (exhausted) instead. Under its topic's
-- retry backoff (includes/backoff.lua) it waits instead (status waiting, its triggerTime when it
-- becomes ready), and the scanner is woken if that is earlier than what it sleeps towards.
-- KEYS[1] inflight
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] events
-- KEYS[8] waiting
-- KEYS[9] meta
-- KEYS[10] prioritised
-- ARGV[1] scan_limit: most messages handled per call (DELAYQUEUE_SCANNER_BATCH)
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[5] topic
-- ARGV[6] actor: 'process@host' for the history, '' with the message log off
-- ARGV[7] schedule_channel: published when a backed-off message is due before what the scanner expects
-- ARGV[8] seed: random, for the backoff's jitter
-- Returns {requeued, µs until the next ack deadline (0: more due now, -1: none), Redis' clock
-- (epoch µs)}
-- @include clock
-- @include stats
-- @include end_message
-- @include scan_reply
-- @include set_ready
-- @include due_to_ready
-- @include backoff
-- @include set_waiting
local t = {inflight = KEYS[1], ready = KEYS[2], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[7],
           actor = ARGV[6], retention = tonumber(ARGV[2])}
local stats, limit, interval = KEYS[6], tonumber(ARGV[1]), tonumber(ARGV[3])
local meta = KEYS[9]
t.waiting = KEYS[8]
t.prioritised = KEYS[10]
local now, now_us = clock()
local ended_count = 0
math.randomseed(tonumber(ARGV[8]))
local backoff_base, backoff_max = backoff_settings(meta)
local wake = false
local backed_off = 0
local ids, requeued = due_to_ready(t, t.inflight, now, limit, ARGV[4], function(id, m)
  if m.status ~= STATUS.CONSUMING then
    return false
  end
  if m.expireTime <= now or m.retry > m.maxRetry then
    end_message(t, id, m, now, end_reason(m, now), STATUS.EXHAUSTED)
    ended_count = ended_count + 1
    return false
  end
  local wait = backoff_wait(backoff_base, backoff_max, m.retry)
  if wait > 0 then
    wake = set_waiting(t, id, m, STATUS.CONSUMING, REASON.ACK_TIMEOUT, now + wait, now_us) or wake
    backed_off = backed_off + 1
    return false
  end
  set_ready(t, id, m, STATUS.CONSUMING, REASON.ACK_TIMEOUT)
  return true
end)
if wake then
  redis.call('PUBLISH', ARGV[7], ARGV[5])
end
requeued = requeued + backed_off
stat_add(stats, interval, now, COUNTER.TIMEOUT, requeued)
stat_add(stats, interval, now, COUNTER.END_LIFE, ended_count)
return scan_reply(requeued, #ids, limit, t.inflight)
