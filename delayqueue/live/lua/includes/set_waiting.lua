-- A message waits again until `trigger` (ms): its status and triggerTime change, its id goes into
-- the waiting set (and out of the expiry index unless its TTL ends first: includes/expiring.lua),
-- and the change is recorded with its times (the log row takes them). Answers
-- whether the topic's scanner must be woken: the message is due before anything it sleeps towards.
-- set_waiting(t, id, message, from status, reason, trigger ms, now µs) -> wake
--   t: msgs, waiting, expiry, events (keys), actor
-- @include history
-- @include next_due
-- @include expiring
-- @include stored
local function set_waiting(t, id, m, from, reason, trigger, now_us)
  local due = next_due(t.waiting, now_us)
  m.status = STATUS.WAITING
  m.triggerTime = trigger
  redis.call('HSET', t.msgs, id, encode_stored(m))
  redis.call('ZADD', t.waiting, trigger, id)
  if not expires_first(m) then
    redis.call('ZREM', t.expiry, id)
  end
  log_event(t.events, t.actor, id, m, from, reason, true)
  return due < 0 or trigger * 1000 - now_us < due
end
