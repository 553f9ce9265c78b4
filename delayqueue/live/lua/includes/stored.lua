-- A message as the msgs hash stores it (core/messages.py reads and writes the same two forms).
-- A waiting message, by far the most numerous (it waits out its delay), is a short record, a
-- third of the JSON's bytes: its triggerTime, the produceTime before it and the TTL after it in
-- hex, maxRetry, retry and priority, the topic up to a newline (a topic has no control
-- characters), then the body; its msgId is the hash field. Any other status is the API's JSON,
-- which a pull answers as it is.
-- encode_stored(message) -> the stored string
-- decode_stored(stored, msgId) -> the message (a table as new_message builds it)
-- wire_json(stored, msgId) -> the message as the API's JSON, whichever form it is stored in
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

local function encode_stored(m)
  if m.status ~= STATUS.WAITING then
    return cjson.encode(m)
  end
  return string.format('%x,%s,%s,%d,%d,%d,', m.triggerTime, signed_hex(m.triggerTime - m.produceTime),
                       signed_hex(m.expireTime - m.triggerTime), m.maxRetry, m.retry, m.priority or 0)
         .. m.topic .. '\n' .. m.msg
end

local function decode_stored(raw, id)
  if string.byte(raw, 1) == 123 then  -- '{': the JSON
    return cjson.decode(raw)
  end
  local trigger, before, ttl, max_retry, retry, priority, topic, body_at =
      string.match(raw, '^(%x+),(%-?%x+),(%-?%x+),(%d+),(%d+),(%d+),([^\n]*)\n()')
  trigger = tonumber(trigger, 16)
  local m = {topic = topic, msgId = id, msg = string.sub(raw, body_at), produceTime = trigger - from_signed_hex(before),
             triggerTime = trigger, expireTime = trigger + from_signed_hex(ttl), maxRetry = tonumber(max_retry),
             retry = tonumber(retry), status = STATUS.WAITING}
  if priority ~= '0' then
    m.priority = tonumber(priority)
  end
  return m
end

local function wire_json(raw, id)
  if string.byte(raw, 1) == 123 then
    return raw
  end
  return cjson.encode(decode_stored(raw, id))
end
