-- The start of an ack or a nack: the topic counts as active and the request is counted; then a
-- consuming message is taken out of the in-flight set.
-- take_consuming(t, interval ms, now ms, id) -> the message, or nil and the status to answer
--   (0: unknown)
--   t: inflight, msgs, stats, meta (keys)
-- @include stats
local function take_consuming(t, interval, now, id)
  redis.call('HSET', t.meta, META.LAST_ACTIVE, now)
  stat_add(t.stats, interval, now, COUNTER.ACK, 1)
  local raw = redis.call('HGET', t.msgs, id)
  if not raw then
    return nil, 0
  end
  local m = cjson.decode(raw)
  if m.status ~= STATUS.CONSUMING then
    return nil, m.status
  end
  redis.call('ZREM', t.inflight, id)
  return m
end
