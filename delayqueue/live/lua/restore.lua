-- Puts messages from the message log back into Redis after a loss: waiting if not yet due,
-- ready otherwise (an in-flight one is ready again, at its priority, after the ready ones of that
-- priority already there, in the order given), with its logged times, retry count and priority.
-- A msgId Redis still holds, in any status, is left alone: Redis is the fresher record; so is a life
-- deleteMsg released the body of (its tombstone in `released`), which the log may not know yet.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] meta
-- KEYS[6] events
-- KEYS[7] prioritised
-- KEYS[8] cold_hours
-- KEYS[9] released
-- KEYS[10] packed
-- ARGV[1] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[2] schedule_channel: published so the topic's scanner looks at the restored messages
-- ARGV[3] topic
-- ARGV[4] dry_run: 1 counts only, 0 restores
-- ARGV[5] actor: 'process@host' for the history, '' with the message log off
-- ARGV[6] with_times: 1 records each message's times in an entry of its own (a TTL given anew, which
-- the log row must take), 0 one entry for the call
-- ARGV[7] cold_counted: 1 when the caller has set the topic's cold count to the rows it leaves in the log
-- (a restore of a topic or of all): those it brings back are not in it, and an entry of one the
-- loader packed is left to the scanner, which finds the msgId held; 0 (single messages) also counts
-- out each message it brings back after loaded_to that is cold there (includes/packed.lua's cold_row:
-- the loader has not read it, or packed it, when it takes it out of its list)
-- ARGV[8...] per message: msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, priority,
-- row_id (its log row's id: where it stands against loaded_to, which may end in its millisecond)
-- Returns {restored, already held}
-- @include clock
-- @include history
-- @include add_messages
-- @include new_message
-- @include cold_count
-- @include stored
-- @include packed
local waiting, ready, msgs, expiry, meta, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local t = {waiting = waiting, ready = ready, prioritised = KEYS[7], expiry = expiry}
local topic = ARGV[3]
local dry_run = ARGV[4] == '1'
local cold_counted = ARGV[7] == '1'
local packed = {packed = KEYS[10], meta = meta}
local now = clock()
local restored, held = 0, 0
local added, changes = {}, {}
-- Messages the cold tier kept in the log only (due after hot_until, or cold after loaded_to) are in
-- Redis once restored.
local hot_until = tonumber(redis.call('HGET', meta, META.HOT_UNTIL) or '-1')
local loaded_to = redis.call('HGET', meta, META.LOADED_TO)
local was_cold = {}

local function counted_cold(id, trigger, row_id)
  if hot_until >= 0 and trigger > hot_until then
    return true
  end
  if cold_counted or not loaded_to or not position_before(loaded_to, trigger .. ':' .. row_id)
      or not cold_row(packed, id, trigger) then
    return false
  end
  remove_packed(packed, id, trigger)  -- if the loader packed it
  return true
end

for i = 8, #ARGV, 9 do
  local id = ARGV[i]
  local m = new_message(topic, id, ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]),
                        tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7]), now)
  if redis.call('ZSCORE', KEYS[9], id .. ':' .. m.produceTime) then
    held = held + 1
  elseif dry_run then
    if redis.call('HEXISTS', msgs, id) == 1 then
      held = held + 1
    else
      restored = restored + 1
    end
  else
    if redis.call('HSETNX', msgs, id, encode_stored(m)) == 0 then
      held = held + 1
    else
      restored = restored + 1
      added[#added + 1] = m
      if counted_cold(id, m.triggerTime, ARGV[i + 8]) then
        was_cold[#was_cold + 1] = m.triggerTime
      end
      changes[#changes + 1] = {id, m.status, m.retry, m.produceTime}
    end
  end
end
if restored > 0 and not dry_run then
  add_messages(t, added, ARGV[1])
  cold_moved(meta, KEYS[8], hours_of(was_cold))
  redis.call('HSET', meta, META.LAST_ACTIVE, now)
  redis.call('HSETNX', meta, META.REGISTERED, 1)
  -- The topic's scanner may be asleep towards a later time, or not know the topic yet.
  redis.call('PUBLISH', ARGV[2], topic)
  if ARGV[6] == '1' then
    for _, m in ipairs(added) do
      log_event(events, ARGV[5], m.msgId, m, 0, REASON.RESTORED, true)
    end
  else
    log_events(events, ARGV[5], changes, 0, REASON.RESTORED)
  end
end
return {restored, held}
