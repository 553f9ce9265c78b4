-- A message becomes ready: its status changes, its id goes onto its priority's ready structure
-- (includes/ready_queue.lua; FIFO within a priority), a waiting one into the expiry index (it may
-- not be there: includes/expiring.lua; a consuming one is), and the change is recorded. Long pollers are
-- the caller's to wake, once per call: a woken poller passes the wake on while messages remain.
-- set_ready(t, id, message, from status, reason, with_times, changes or nil) -> the size of the ready structure
--   it went onto (1: it was empty, wake long pollers)
--   with_times: the change moved the message's times (see log_event)
--   changes: the change joins it (add_change) for the caller's log_events, instead of its own entry
--   t: msgs, ready, prioritised, expiry, events (keys), actor
-- @include history
-- @include ready_queue
-- @include stored
local function set_ready(t, id, m, from, reason, with_times, changes)
  m.status = STATUS.READY
  redis.call('HSET', t.msgs, id, encode_stored(m))
  if from == STATUS.WAITING then
    redis.call('ZADD', t.expiry, m.expireTime, id)
  end
  if changes then
    add_change(changes, id, m)
  else
    log_event(t.events, t.actor, id, m, from, reason, with_times)
  end
  return push_ready(t, id, m.priority)
end
