-- The ready messages of a topic: priority 0 (absent in old messages) on the ready list, LPUSH in,
-- RPOP out, as before priorities existed; priorities 1-9 in the `prioritised` sorted set, which
-- exists only while it holds any, so a topic that never uses priority touches nothing else. Its
-- score is the level's band (constants.PRIORITY_BAND; the highest level lowest, ZPOPMIN takes it
-- first) plus the arrival within the band (one more than the band's last), so each level is FIFO.
-- push_ready(t, id, priority) -> size of the structure it went onto (1: that one was empty)
-- pop_ready(t, n) -> up to n ids, the highest priority first, the oldest first within one
-- ready_count(t) -> ready messages of every level
-- remove_ready(t, id, priority)
--   t: ready, prioritised (keys)
local function push_ready(t, id, priority)
  if not priority or priority == 0 then
    return redis.call('LPUSH', t.ready, id)
  end
  local base = (MAX_PRIORITY - priority) * PRIORITY_BAND
  local last = redis.call('ZREVRANGEBYSCORE', t.prioritised, string.format('(%d', base + PRIORITY_BAND),
    string.format('%d', base), 'WITHSCORES', 'LIMIT', 0, 1)
  local score = last[2] and tonumber(last[2]) + 1 or base
  redis.call('ZADD', t.prioritised, string.format('%d', score), id)
  return redis.call('ZCARD', t.prioritised)
end

local function pop_ready(t, n)
  local ids = {}
  local top = redis.call('ZPOPMIN', t.prioritised, n)
  for j = 1, #top, 2 do
    ids[#ids + 1] = top[j]
  end
  if #ids < n then
    for _, id in ipairs(redis.call('RPOP', t.ready, n - #ids) or {}) do
      ids[#ids + 1] = id
    end
  end
  return ids
end

local function ready_count(t)
  return redis.call('LLEN', t.ready) + redis.call('ZCARD', t.prioritised)
end

local function remove_ready(t, id, priority)
  if priority and priority > 0 then
    redis.call('ZREM', t.prioritised, id)
  else
    -- The oldest ready ids sit at the tail, where LREM with a negative count starts.
    redis.call('LREM', t.ready, -1, id)
  end
end
