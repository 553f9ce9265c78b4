-- Takes a message's id out of the queue structure its status puts it in (every script keeps
-- that invariant): the waiting set, the ready list or the in-flight set.
-- remove_from_queues(t, id, status)
--   t: waiting, ready, inflight (keys)
local function remove_from_queues(t, id, status)
  if status == STATUS.WAITING then
    redis.call('ZREM', t.waiting, id)
  elseif status == STATUS.READY then
    -- The oldest ready ids sit at the tail, where LREM with a negative count starts.
    redis.call('LREM', t.ready, -1, id)
  elseif status == STATUS.CONSUMING then
    redis.call('ZREM', t.inflight, id)
  end
end
