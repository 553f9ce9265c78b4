-- Lifecycle history: a status change goes into the topic's event stream in the same atomic step
-- as the change itself; the scanners' log writer drains the stream into PostgreSQL. The entry
-- id (Redis time) is the event's time and its idempotency key; produceTime tells apart two
-- lives of one msgId. An actor of '' means the message log is off: nothing is recorded.
-- The entries' field names: live/history.py (the prelude's EVENT table).
-- log_event(events key, actor, msgId, message, from status, reason, with_times)
--   with_times: the message's triggerTime and expireTime go too, for a change that moved them
--   (the writer sets them on the log row, so a restore brings back the new times)
-- log_events(events key, actor, {{msgId, to status, retry, produceTime}, ...}, from status, reason):
--   the same change of many messages as one entry (EVENT.batch), one XADD per call, not per message
-- add_change(changes, msgId, message): the message's change (no times, no detail) joins a list
--   that one log_events call records
-- set_event_detail(text): the events this script logs from now on carry it (EVENT.detail): a push
--   attempt's HTTP status or error, a consumer's nack reason
local event_detail = ''

local function set_event_detail(text)
  event_detail = text
end

-- The writer reads a stream when told it has entries: one notice as the stream goes from empty
-- to non-empty is enough, since the writer reads on while entries remain.
local function notify_writer(events)
  if redis.call('XLEN', events) == 1 then
    redis.call('PUBLISH', string.sub(events, 1, -#EVENTS_SUFFIX - 1) .. HISTORY_SUFFIX, '')
  end
end

local function log_event(events, actor, id, m, from, reason, with_times)
  if actor ~= '' then
    local entry = {EVENT.msg_id, id, EVENT.from_status, from, EVENT.to_status, m.status, EVENT.retry, m.retry,
                   EVENT.produce_time, m.produceTime, EVENT.reason, reason, EVENT.actor, actor}
    if with_times then
      table.insert(entry, EVENT.trigger_time)
      table.insert(entry, m.triggerTime)
      table.insert(entry, EVENT.expire_time)
      table.insert(entry, m.expireTime)
    end
    if event_detail ~= '' then
      table.insert(entry, EVENT.detail)
      table.insert(entry, event_detail)
    end
    redis.call('XADD', events, '*', unpack(entry))
    notify_writer(events)
  end
end

local function add_change(changes, id, m)
  changes[#changes + 1] = {id, m.status, m.retry, m.produceTime}
end

local function log_events(events, actor, changes, from, reason)
  if actor ~= '' and #changes > 0 then
    redis.call('XADD', events, '*', EVENT.batch, cjson.encode(changes), EVENT.from_status, from, EVENT.reason, reason,
               EVENT.actor, actor)
    notify_writer(events)
  end
end
