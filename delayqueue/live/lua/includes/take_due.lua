-- The loop of a scanner script: the ids are taken out of the due sorted set they came from, and
-- fn(id, message, stored) is called for each whose body is still there, in order. One ZREM and one HMGET
-- for all of them.
-- take_due(sorted set key, msgs key, ids, fn)
-- @include stored
-- @include chunked
local function take_due(zset, msgs, ids, fn)
  call_chunked('ZREM', zset, ids)
  local raws = hmget_chunked(msgs, ids)
  for j, id in ipairs(ids) do
    if raws[j] then
      fn(id, decode_stored(raws[j], id), raws[j])
    end
  end
end
