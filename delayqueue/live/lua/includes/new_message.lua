-- A message as Redis stores it: the API's message (its JSON is what getMsg and a pull answer), with
-- priority only above 0, so a message sent without one is stored exactly as camellia's. Its field
-- names are core/messages.py's (Message.to_wire): tests/unit/test_script_headers.py holds every
-- script's use of them to that list.
-- new_message(topic, msgId, payload, produceTime, triggerTime, expireTime, maxRetry, retry, priority, now ms)
--   -> the message, waiting if its triggerTime is after now, ready otherwise
local function new_message(topic, id, payload, produce, trigger, expire, max_retry, retry, priority, now)
  local m = {
    topic = topic,
    msgId = id,
    msg = payload,
    produceTime = produce,
    triggerTime = trigger,
    expireTime = expire,
    maxRetry = max_retry,
    retry = retry,
    status = (trigger <= now) and STATUS.READY or STATUS.WAITING,
  }
  if priority > 0 then
    m.priority = priority
  end
  return m
end
