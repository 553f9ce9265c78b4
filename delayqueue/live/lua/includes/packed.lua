-- Waiting messages packed in lists: the cold tier's messages the loader has read ahead (and sends
-- due among them), a list per second of due time, `<packed>:<second>`, each named in the packed
-- sorted set (score: the second's first ms). An entry is a message in about 40 bytes besides its
-- body: a list of them costs Redis little more than what they hold, where the waiting set and the
-- msgs hash cost 350 bytes a message. Nothing in Redis finds a packed message by its msgId: the
-- message log does (services/messages.py treats it as cold, as it is after loaded_to), and a
-- delete or reschedule takes its entry out (remove_packed). They count as cold (includes/cold_count.lua),
-- and the meta's packed counts the entries (what the loader's room counts besides the waiting set).
-- An entry: the msgId's form (0: 32 lowercase hex digits, as 16 bytes after the header; else the
-- msgId's length, its bytes after the header), the triggerTime's ms within its second, the
-- produceTime before the triggerTime, the TTL after it, maxRetry, retry, priority; then the body.
-- packable(m) -> whether an entry can hold it (a msgId of at most 255 bytes, a TTL not before it is due)
-- pack(t, messages) -> whether one's second is now the first packed one (the scanner may sleep
--   past it); one RPUSH per second, not per message: a page or a batch comes in thousands
-- packed_message(entry, topic, second) -> the message (includes/stored.lua's waiting_message)
-- remove_packed(t, id, trigger) -> 1 if the message was packed and is out
-- cold_row(t, id, trigger) -> whether the msgId's waiting log row due at trigger, after loaded_to, that
--   Redis does not hold live is cold: at or after fetched_to's ms (the loader has not read it), or
--   packed. One between the two in no list went into the waiting set (due too near to pack) and
--   Redis has ended it since: the log writer has not caught up yet.
-- drop_packed(t): the lists go, and fetched_to with them: their rows are after loaded_to, where
--   the loader reads again (they stay counted cold meanwhile)
-- position_before(a, b): whether loader position a ("<ms>:<row id>[:<fence>]") comes before b
--   t: packed, meta (keys)
-- @include stored
-- @include chunked
local PACKED_HEADER = '>BHi6i6I3I3B'

local function packed_list(t, second)
  return t.packed .. ':' .. second
end

local function is_hex_id(id)
  return #id == 32 and not string.find(id, '[^0-9a-f]')
end

local function packable(m)
  return #m.msgId <= 255 and m.expireTime >= m.triggerTime
end

local function packed_entry(m, second)
  local id, form = m.msgId, #m.msgId
  if is_hex_id(id) then
    form = 0
    id = struct.pack('>I4I4I4I4', tonumber(string.sub(id, 1, 8), 16), tonumber(string.sub(id, 9, 16), 16),
                     tonumber(string.sub(id, 17, 24), 16), tonumber(string.sub(id, 25, 32), 16))
  end
  return struct.pack(PACKED_HEADER, form, m.triggerTime - second * 1000, m.triggerTime - m.produceTime,
                     m.expireTime - m.triggerTime, m.maxRetry, m.retry, m.priority or 0) .. id .. m.msg
end

local function pack(t, messages)
  if #messages == 0 then
    return false
  end
  local by_second, seconds = {}, {}
  for _, m in ipairs(messages) do
    local second = math.floor(m.triggerTime / 1000)
    if not by_second[second] then
      by_second[second] = {}
      seconds[#seconds + 1] = second * 1000
      seconds[#seconds + 1] = second
    end
    local entries = by_second[second]
    entries[#entries + 1] = packed_entry(m, second)
  end
  for second, entries in pairs(by_second) do
    call_chunked('RPUSH', packed_list(t, second), entries)
  end
  local added = call_chunked('ZADD', t.packed, seconds)
  redis.call('HINCRBY', t.meta, META.PACKED, #messages)
  if added == 0 then
    return false
  end
  local first = tonumber(redis.call('ZRANGE', t.packed, 0, 0)[1])
  return by_second[first] ~= nil
end

-- The entry's msgId and where its body starts, after the header's values.
local function entry_id(entry)
  local form, ms, before, ttl, max_retry, retry, priority, at = struct.unpack(PACKED_HEADER, entry)
  local id
  if form == 0 then
    id = string.format('%08x%08x%08x%08x', struct.unpack('>I4I4I4I4', entry, at))
    at = at + 16
  else
    id = string.sub(entry, at, at + form - 1)
    at = at + form
  end
  return id, at, ms, before, ttl, max_retry, retry, priority
end

local function packed_message(entry, topic, second)
  local id, at, ms, before, ttl, max_retry, retry, priority = entry_id(entry)
  return waiting_message(topic, id, string.sub(entry, at), second * 1000 + ms, before, ttl, max_retry, retry, priority)
end

local function drop_packed(t)
  for _, second in ipairs(redis.call('ZRANGE', t.packed, 0, -1)) do
    redis.call('DEL', packed_list(t, second))
  end
  redis.call('DEL', t.packed)
  redis.call('HDEL', t.meta, META.FETCHED_TO, META.PACKED)
end

local function position_before(a, b)
  local a_time, a_id = string.match(a, '^([^:]*):([^:]*)')
  local b_time, b_id = string.match(b, '^([^:]*):([^:]*)')
  a_time, b_time = tonumber(a_time), tonumber(b_time)
  return a_time < b_time or (a_time == b_time and tonumber(a_id) < tonumber(b_id))
end

-- The msgId's entry in the list of trigger's second (nil if none), and that list.
local function packed_entry_of(t, id, trigger)
  local list = packed_list(t, math.floor(trigger / 1000))
  for _, entry in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if entry_id(entry) == id then
      return entry, list
    end
  end
  return nil, list
end

local function remove_packed(t, id, trigger)
  local entry, list = packed_entry_of(t, id, trigger)
  if not entry then
    return 0
  end
  redis.call('LREM', list, 1, entry)
  redis.call('HINCRBY', t.meta, META.PACKED, -1)
  if redis.call('EXISTS', list) == 0 then
    redis.call('ZREM', t.packed, math.floor(trigger / 1000))
  end
  return 1
end

local function cold_row(t, id, trigger)
  local fetched = redis.call('HGET', t.meta, META.FETCHED_TO)
  return not fetched or trigger >= tonumber(string.match(fetched, '^[^:]*')) or packed_entry_of(t, id, trigger) ~= nil
end
