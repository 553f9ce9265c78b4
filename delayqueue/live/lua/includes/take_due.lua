-- The loop of a scanner script: each id is taken out of the due sorted set it came from, and
-- fn(id, message) is called for those whose body is still there.
-- take_due(sorted set key, msgs key, ids, fn)
-- @include stored
local function take_due(zset, msgs, ids, fn)
  for _, id in ipairs(ids) do
    redis.call('ZREM', zset, id)
    local raw = redis.call('HGET', msgs, id)
    if raw then
      fn(id, decode_stored(raw, id))
    end
  end
end
