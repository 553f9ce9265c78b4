-- Gives a waiting or ready message a new trigger time: trigger_time, or Redis' now + delay_millis;
-- one not after now is due now (ready at its priority, keeping its place if it was ready already). Its expireTime
-- moves by as much as its triggerTime, so its TTL counts from the new trigger time, unless it came before
-- the triggerTime (the TTL ends during a nack's delay or a backoff): then it stays. A live message
-- found past its TTL is ended first (expired or exhausted), as a reader would.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] stats
-- KEYS[8] meta
-- KEYS[9] events
-- KEYS[10] prioritised
-- KEYS[11] cold_hours
-- KEYS[12] packed
-- ARGV[1] msg_id
-- ARGV[2] trigger_time: epoch ms; -1: from delay_millis
-- ARGV[3] delay_millis: from Redis' now, when trigger_time is -1
-- ARGV[4] retention_millis: how long an ended body stays readable
-- ARGV[5] stats_interval_millis
-- ARGV[6] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[7] schedule_channel: published when it is due or expires before what the scanner expects
-- ARGV[8] topic
-- ARGV[9] actor: 'process@host' for the history, '' with the message log off
-- ARGV[10] cold: '' or, for a cold message the caller has rescheduled in the message log, its stored
-- form (includes/stored.lua) as rescheduled (waiting, its new times; trigger_time then is that triggerTime): if Redis does
-- not hold the msgId, it comes into Redis when its new time is within the hot window, or when its
-- old one was (a loader may have read the old row: the msgId held, it leaves it); else it stays cold
-- ARGV[11] old_trigger_time: the cold message's triggerTime before
-- ARGV[12] signed: 1 for a shard of a sharded topic (the count a cold message moves in or out of:
-- includes/cold_count.lua's signed_part)
-- Returns {1, the message json} when rescheduled, {0, 0} when unknown, {2, status} when consuming,
-- {3, status} when ended, {4, the message json} when the cold message stays in the log only.
-- @include clock
-- @include status
-- @include end_message
-- @include set_ready
-- @include set_waiting
-- @include add_messages
-- @include cold_count
-- @include packed
-- @include stored
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], msgs = KEYS[4], expiry = KEYS[5],
           ended = KEYS[6], stats = KEYS[7], events = KEYS[9], prioritised = KEYS[10],
           actor = ARGV[9], retention = tonumber(ARGV[4])}
local id = ARGV[1]
local now, now_us = clock()
local raw = redis.call('HGET', t.msgs, id)
if not raw and ARGV[10] ~= '' then
  local m = decode_stored(ARGV[10], id)
  if ARGV[12] == '1' then
    signed_part(KEYS[8])
  end
  remove_packed({packed = KEYS[12], meta = KEYS[8]}, id, tonumber(ARGV[11]))  -- if the loader had read it ahead
  local hot = redis.call('HGET', KEYS[8], META.HOT_UNTIL)
  local old_hours = hours_of({tonumber(ARGV[11])})
  if hot and m.triggerTime > tonumber(hot) and tonumber(ARGV[11]) > tonumber(hot) then
    if redis.call('HEXISTS', KEYS[8], META.COLD) == 1 then  -- the count stays; its hour moves
      cold_moved(KEYS[8], KEYS[11], old_hours)
      cold_added(KEYS[8], KEYS[11], m.triggerTime)
    end
    return {4, wire_json(ARGV[10], id)}
  end
  if m.triggerTime <= now then
    m.status = STATUS.READY
  end
  cold_moved(KEYS[8], KEYS[11], old_hours)
  redis.call('HSET', t.msgs, id, encode_stored(m))
  add_messages(t, {m}, ARGV[6])
  if m.status == STATUS.READY then
    log_event(t.events, t.actor, id, m, STATUS.WAITING, REASON.RESCHEDULED, true)
  end
  redis.call('PUBLISH', ARGV[7], ARGV[8])
  return {1, cjson.encode(m)}
end
if not raw then
  return {0, 0}
end
local m = decode_stored(raw, id)
if is_live(m) and m.expireTime <= now then
  end_expired(t, id, m, now, tonumber(ARGV[5]))
end
if m.status == STATUS.CONSUMING then
  return {2, m.status}
end
if not is_live(m) then
  return {3, m.status}
end
redis.call('HSET', KEYS[8], META.LAST_ACTIVE, now)
local trigger = tonumber(ARGV[2])
if trigger < 0 then
  trigger = now + tonumber(ARGV[3])
end
if trigger < now then
  trigger = now
end
local from = m.status
-- A TTL that ends during the wait (a nack's delay or a backoff past it) stays: moved back with the
-- trigger time, a run now would put it in the past, ending the message it makes ready.
if m.expireTime >= m.triggerTime then
  m.expireTime = m.expireTime + trigger - m.triggerTime
end
local wake = false
if trigger <= now or m.expireTime < trigger then  -- in the expiry index after (includes/expiring.lua)
  local due = next_due(t.expiry, now_us)
  wake = due < 0 or (m.expireTime - now) * 1000 < due
  redis.call('ZADD', t.expiry, m.expireTime, id)
end
if trigger > now then
  if from == STATUS.READY then
    remove_from_queues(t, id, m)
  end
  wake = set_waiting(t, id, m, from, REASON.RESCHEDULED, trigger, now_us) or wake
elseif from == STATUS.READY then
  m.triggerTime = trigger
  redis.call('HSET', t.msgs, id, encode_stored(m))
  log_event(t.events, t.actor, id, m, from, REASON.RESCHEDULED, true)
else
  redis.call('ZREM', t.waiting, id)
  m.triggerTime = trigger
  if set_ready(t, id, m, from, REASON.RESCHEDULED, true) == 1 then
    redis.call('PUBLISH', ARGV[6], t.ready)  -- its queue (list or prioritised set) was empty: wake long pollers
  end
end
if wake then
  redis.call('PUBLISH', ARGV[7], ARGV[8])
end
return {1, cjson.encode(m)}
