-- Takes a message's id out of the queue structure its status puts it in (every script keeps
-- that invariant): the waiting set, the ready queue (list or prioritised set) or the in-flight set.
-- remove_from_queues(t, id, message)
--   t: waiting, ready, prioritised, inflight (keys)
-- @include ready_queue
local function remove_from_queues(t, id, m)
  local status = m.status
  if status == STATUS.WAITING then
    redis.call('ZREM', t.waiting, id)
  elseif status == STATUS.READY then
    remove_ready(t, id, m.priority)
  elseif status == STATUS.CONSUMING then
    redis.call('ZREM', t.inflight, id)
  end
end
