-- A message becomes ready: its status changes, its id goes onto the ready list (FIFO: LPUSH
-- here, RPOP in pull), and the change is recorded. Long pollers are the caller's to wake, once
-- per call: a woken poller passes the wake on while messages remain.
-- set_ready(t, id, message, from status, reason) -> the ready list's length
--   t: msgs, ready, events (keys), actor
-- @include history
local function set_ready(t, id, m, from, reason)
  m.status = STATUS.READY
  redis.call('HSET', t.msgs, id, cjson.encode(m))
  log_event(t.events, t.actor, id, m, from, reason)
  return redis.call('LPUSH', t.ready, id)
end
