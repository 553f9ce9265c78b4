-- A message as the msgs hash stores it (core/messages.py reads and writes the same forms): a short
-- record, a third of the JSON's bytes: its triggerTime, the produceTime before it and the TTL after
-- it in hex, maxRetry, retry and priority, the topic up to a newline (a topic has no control
-- characters), then the body; its msgId is the hash field. A waiting message, by far the most
-- numerous (it waits out its delay), is the record alone; any other status leads it with '!', the
-- status and a comma (a waiting record starts with a hex digit). A body stored by an older version
-- as the API's JSON (it starts with '{') is still read.
-- encode_stored(message) -> the stored string
-- decode_stored(stored, msgId) -> the message (a table as new_message builds it)
-- stored_with_status(stored, message) -> what stores a message read from `stored` whose status alone changed
--   (from waiting, the record is kept as it is, behind its new lead)
-- wire_json(stored, msgId) -> the message as the API's JSON, whichever form it is stored in
-- waiting_message(topic, msgId, body, triggerTime, produced before it, TTL after it, maxRetry, retry,
--   priority) -> a waiting message's table, from what a record (or a packed entry) keeps
local function signed_hex(n)
  if n < 0 then
    return '-' .. string.format('%x', -n)
  end
  return string.format('%x', n)
end

local function from_signed_hex(text)
  if string.byte(text, 1) == 45 then  -- '-'
    return -tonumber(string.sub(text, 2), 16)
  end
  return tonumber(text, 16)
end

local function led(status, record)
  if status == STATUS.WAITING then
    return record
  end
  return '!' .. status .. ',' .. record
end

local function encode_stored(m)
  return led(m.status, string.format('%x,%s,%s,%d,%d,%d,', m.triggerTime, signed_hex(m.triggerTime - m.produceTime),
                                     signed_hex(m.expireTime - m.triggerTime), m.maxRetry, m.retry, m.priority or 0)
                       .. m.topic .. '\n' .. m.msg)
end

local function waiting_message(topic, id, body, trigger, before, ttl, max_retry, retry, priority)
  local m = {topic = topic, msgId = id, msg = body, produceTime = trigger - before, triggerTime = trigger,
             expireTime = trigger + ttl, maxRetry = max_retry, retry = retry, status = STATUS.WAITING}
  if priority > 0 then
    m.priority = priority
  end
  return m
end

local function decode_stored(raw, id)
  local first = string.byte(raw, 1)
  if first == 123 then  -- '{': the JSON
    return cjson.decode(raw)
  end
  local status, at = STATUS.WAITING, 1
  if first == 33 then  -- '!': not waiting
    local digits
    digits, at = string.match(raw, '^!(%d+),()')
    status = tonumber(digits)
  end
  local trigger, before, ttl, max_retry, retry, priority, topic, body_at =
      string.match(raw, '^(%x+),(%-?%x+),(%-?%x+),(%d+),(%d+),(%d+),([^\n]*)\n()', at)
  local m = waiting_message(topic, id, string.sub(raw, body_at), tonumber(trigger, 16), from_signed_hex(before),
                            from_signed_hex(ttl), tonumber(max_retry), tonumber(retry), tonumber(priority))
  m.status = status
  return m
end

local function wire_json(raw, id)
  if string.byte(raw, 1) == 123 then
    return raw
  end
  return cjson.encode(decode_stored(raw, id))
end

local function stored_with_status(raw, m)
  local first = string.byte(raw, 1)
  if first ~= 33 and first ~= 123 then  -- a waiting record: the same record under the new lead
    return led(m.status, raw)
  end
  return encode_stored(m)
end
