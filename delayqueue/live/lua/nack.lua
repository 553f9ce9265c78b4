-- Gives a consuming message back (ack=false): ready again at once at its priority (or after the topic's retry
-- backoff, includes/backoff.lua, waiting meanwhile), or waiting for delay_millis
-- (retry count kept; its expireTime stays, so a delay past it ends the message then), or ended
-- (exhausted) when it has no deliveries or TTL left. With dead_letter it ends now as a dead
-- letter (exhausted, reason dead_lettered). Any other state is left alone. A failed push attempt gives
-- its message back as a nack does, with reason 'push_failed' and the status or error as the detail; a consumer's
-- reason is the detail of its nack's event.
-- KEYS[1] inflight
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] meta
-- KEYS[8] events
-- KEYS[9] waiting
-- KEYS[10] prioritised
-- ARGV[1] msg_id
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[5] topic
-- ARGV[6] actor: 'process@host' for the history, '' with the message log off
-- ARGV[7] delay_millis: ms until it is due again; -1: none given (the topic's retry backoff applies)
-- ARGV[8] dead_letter: 1 ends it now as a dead letter
-- ARGV[9] schedule_channel: published when it waits and is due before what the scanner expects
-- ARGV[10] seed: for the backoff's jitter
-- ARGV[11] push_failure: '' for a consumer's nack; else the failed push attempt's status or error
-- ARGV[12] default_backoff_millis: the backoff's first wait when the topic sets none (0: ready at once)
-- ARGV[13] reason: '' or a consumer's why, the detail of the event this nack logs (a dead letter's deadDetail)
-- ARGV[14] retry: '' or the retry of the delivery it gives back (one delivered again since is left alone)
-- Returns {1, its status now} when it was consuming (under that retry, when given), else {0, its status (0: unknown)}.
-- @include clock
-- @include take_consuming
-- @include end_message
-- @include set_ready
-- @include set_waiting
-- @include backoff
local t = {inflight = KEYS[1], ready = KEYS[2], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], stats = KEYS[6],
           meta = KEYS[7], events = KEYS[8], waiting = KEYS[9], prioritised = KEYS[10],
           actor = ARGV[6], retention = tonumber(ARGV[2])}
local id = ARGV[1]
local interval = tonumber(ARGV[3])
local now, now_us = clock()
count_settles(t, interval, now, 1)
local m, status = take_consuming(t, id, ARGV[14])
if not m then
  return {0, status}
end
local given_back = REASON.NACKED
if ARGV[11] ~= '' then
  given_back = REASON.PUSH_FAILED
  set_event_detail(ARGV[11])
elseif ARGV[13] ~= '' then
  set_event_detail(ARGV[13])
end
if ARGV[8] == '1' then
  stat_add(t.stats, interval, now, COUNTER.END_LIFE, 1)
  return {1, end_message(t, id, m, now, REASON.DEAD_LETTERED, STATUS.EXHAUSTED)}
end
if m.expireTime <= now or m.retry > m.maxRetry then
  stat_add(t.stats, interval, now, COUNTER.END_LIFE, 1)
  return {1, end_message(t, id, m, now, end_reason(m, now), STATUS.EXHAUSTED)}
end
local delay = tonumber(ARGV[7])
if delay < 0 then
  math.randomseed(tonumber(ARGV[10]))
  local base, max = backoff_settings(t.meta)
  if base <= 0 then
    base = tonumber(ARGV[12])
  end
  delay = backoff_wait(base, max, m.retry)
end
if delay > 0 then
  if set_waiting(t, id, m, STATUS.CONSUMING, given_back, now + delay, now_us) then
    redis.call('PUBLISH', ARGV[9], ARGV[5])
  end
  return {1, STATUS.WAITING}
end
if set_ready(t, id, m, STATUS.CONSUMING, given_back) == 1 then
  redis.call('PUBLISH', ARGV[4], t.ready)
end
return {1, STATUS.READY}
