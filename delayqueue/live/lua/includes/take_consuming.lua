-- The start of an ack or a nack: the topic counts as active and the messages are counted (once
-- per call, however many it settles); then each consuming message is taken out of the in-flight set.
-- count_settles(t, interval ms, now ms, how many)
-- take_consuming(t, id, retry) -> the message, or nil and the status to answer (0: unknown)
-- take_consuming_many(t, ids, retries) -> the ids taken and their messages (a msgId given twice is
--   taken once), and every message found by its id
--   retries: nil, or per id the retry of the delivery the caller settles ('': any); a message
--   consuming under another one (delivered again since) is not taken
--   t: inflight, msgs, stats, meta (keys)
-- @include stats
-- @include stored
-- @include chunked
local function count_settles(t, interval, now, n)
  redis.call('HSET', t.meta, META.LAST_ACTIVE, now)
  stat_add(t.stats, interval, now, COUNTER.ACK, n)
end

local function take_consuming_many(t, ids, retries)
  local raws = hmget_chunked(t.msgs, ids)
  local taken_ids, taken, found = {}, {}, {}
  for j, id in ipairs(ids) do
    if raws[j] and not found[id] then
      local m = decode_stored(raws[j], id)
      found[id] = m
      local retry = retries and retries[j] or ''
      if m.status == STATUS.CONSUMING and (retry == '' or tonumber(retry) == m.retry) then
        taken_ids[#taken_ids + 1] = id
        taken[#taken + 1] = m
      end
    end
  end
  call_chunked('ZREM', t.inflight, taken_ids)
  return taken_ids, taken, found
end

local function take_consuming(t, id, retry)
  local _, taken, found = take_consuming_many(t, {id}, {retry})
  if taken[1] then
    return taken[1]
  end
  return nil, found[id] and found[id].status or 0
end
