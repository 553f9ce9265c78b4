-- A message becomes ready: its status changes, its id goes onto the ready list (FIFO: LPUSH
-- here, RPOP in pull), and the change is recorded. Long pollers are the caller's to wake, once
-- per call: a woken poller passes the wake on while messages remain.
-- set_ready(t, id, message, from status, reason, with_times) -> the ready list's length
--   with_times: the change moved the message's times (see log_event)
--   t: msgs, ready, events (keys), actor
-- @include history
local function set_ready(t, id, m, from, reason, with_times)
  m.status = STATUS.READY
  redis.call('HSET', t.msgs, id, cjson.encode(m))
  log_event(t.events, t.actor, id, m, from, reason, with_times)
  return redis.call('LPUSH', t.ready, id)
end
