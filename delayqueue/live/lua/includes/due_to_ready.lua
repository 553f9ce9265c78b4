-- The body of requeue_timed_out: takes up to `limit` due members of a sorted set, hands each
-- message still there to decide(id, message), which answers true when it made the message ready,
-- and, given a channel, wakes long pollers once if the topic had no ready message (at any
-- priority) and now has some: it publishes the ready key's name, which names the topic and the
-- shard (live/keys.NamespaceKeys.shard_of_ready).
-- due_to_ready(t, sorted set key, now ms, limit, ready channel or nil, decide) -> ids taken, made ready
--   t: ready, prioritised, msgs (keys)
-- @include take_due
-- @include ready_queue
local function due_to_ready(t, zset, now, limit, channel, decide)
  local ids = redis.call('ZRANGEBYSCORE', zset, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then  -- the common case: nothing due, nothing more to read
    return ids, 0
  end
  local was_empty = channel and ready_count(t) == 0
  local made_ready = 0
  take_due(zset, t.msgs, ids, function(id, m)
    if decide(id, m) then
      made_ready = made_ready + 1
    end
  end)
  if made_ready > 0 and was_empty then
    redis.call('PUBLISH', channel, t.ready)
  end
  return ids, made_ready
end
