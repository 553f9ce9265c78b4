-- Accepts one message: waiting if it is not yet due by Redis' clock, ready otherwise. A live
-- duplicate msgId enqueues nothing and returns the stored message; so does the msgId of a message
-- that ended less than dedupe_window_millis ago (a retried send must not deliver twice: Redis
-- answers for as long as it keeps ended messages, the message log beyond that); one that ended
-- earlier starts afresh. A live duplicate past its TTL ends now (expired) and counts as ended.
-- Its times come from the caller, which wrote the same times to the message log first, with the
-- 'sent' history row (so this script records no event for the message it enqueues).
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] meta
-- KEYS[8] stats
-- KEYS[9] prioritised
-- KEYS[10] events
-- KEYS[11] cold_hours
-- ARGV[1] msg_id
-- ARGV[2] payload
-- ARGV[3] trigger_time: epoch ms, not before produce_time
-- ARGV[4] expire_time: epoch ms
-- ARGV[5] max_retry
-- ARGV[6] topic
-- ARGV[7] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[8] schedule_channel: published when the message is due or expires before what the scanner expects
-- ARGV[9] stats_interval_millis
-- ARGV[10] produce_time: epoch ms, the sending process' clock
-- ARGV[11] max_live: the topic's live-message cap, 0 for none
-- ARGV[12] namespace_capped: 1 when the namespace has a live-message cap (the topic's share of it
-- is then a cap too, see borrow_live.lua)
-- ARGV[13] priority: 0-9, higher pulled first (kept in the message only when above 0)
-- ARGV[14] retention_millis: how long an ended body stays readable (the ended set's scores are the
-- end plus this)
-- ARGV[15] actor: 'process@host' for the history, '' with the message log off
-- ARGV[16] dedupe_window_millis: an ended message's msgId stays taken this long after its end (0: a
-- redrive's new life replaces its dead letter)
-- ARGV[17] cold_tier: 1 leaves a message due after the meta's hot_until in the message log only
-- (the loader brings it in ahead of its time)
-- ARGV[18] logged_waiting: '' or the triggerTime of the waiting message the message log holds
-- under this msgId: if Redis does not hold it live and it is due at or after the loader's
-- loaded_to, it is cold (or on its way in), and this send is its duplicate; one due before is a
-- row the log writer has not caught up with (Redis ended the message)
-- Returns {1, status, newTopic (1|0)} when created (the caller has the rest of the message),
-- {0, stored message json, newTopic (1|0)} for a live duplicate or one ended within the window,
-- {2, 0, newTopic (1|0)} when the topic holds max_live live messages already, or {3, 0, newTopic (1|0)}
-- when it holds its share of the namespace's cap (nothing enqueued in either), {4, 0, newTopic (1|0)}
-- when created cold (in the log only), {5, 0, newTopic (1|0)} for a duplicate of the log's live message.
-- @include clock
-- @include stats
-- @include status
-- @include next_due
-- @include remove_from_queues
-- @include ready_queue
-- @include new_message
-- @include end_message
-- @include cold_count
local msgs, expiry, ended, meta, stats = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local retention = tonumber(ARGV[14])
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], prioritised = KEYS[9], msgs = msgs,
           expiry = expiry, ended = ended, stats = stats, events = KEYS[10], actor = ARGV[15], retention = retention}
local id, topic = ARGV[1], ARGV[6]
local now, now_us = clock()

redis.call('HSET', meta, META.LAST_ACTIVE, now)
-- 'registered' is 0 from the topic's first send until its caller has registered it
-- (confirm_registered.lua): a registration that failed is made by the next send.
local new_topic = redis.call('HGET', meta, META.REGISTERED) ~= '1' and 1 or 0
if new_topic == 1 then
  redis.call('HSETNX', meta, META.REGISTERED, 0)
end
stat_add(stats, tonumber(ARGV[9]), now, COUNTER.SEND, 1)

local existing = redis.call('HGET', msgs, id)
local old = existing and cjson.decode(existing)
if old and is_live(old) then
  if old.expireTime > now then
    return {0, existing, new_topic}
  end
  end_expired(t, id, old, now, tonumber(ARGV[9]))  -- past its TTL: it ends (a dead letter), as a scan would end it
  existing = cjson.encode(old)
end
if old then
  local purge_at = redis.call('ZSCORE', ended, id)
  if purge_at and tonumber(purge_at) - retention + tonumber(ARGV[16]) > now then
    return {0, existing, new_topic}
  end
end
if ARGV[18] ~= '' and not (old and is_live(old)) then
  local loaded_to = redis.call('HGET', meta, META.LOADED_TO)
  if loaded_to and tonumber(ARGV[18]) >= tonumber(string.match(loaded_to, '^[^:]*')) then
    return {5, 0, new_topic}
  end
end
-- The caps hold exactly, whatever runs concurrently (an ended message is in no count).
local max_live, namespace_capped = tonumber(ARGV[11]), ARGV[12] == '1'
if max_live > 0 or namespace_capped then
  local live = live_count(expiry, meta)
  if max_live > 0 and live >= max_live then
    return {2, 0, new_topic}
  end
  if namespace_capped and live >= tonumber(redis.call('HGET', meta, META.LIVE_SHARE) or '0') then
    return {3, 0, new_topic}
  end
end
local trigger = tonumber(ARGV[3])
if ARGV[17] == '1' and trigger > now then
  local hot_until = redis.call('HGET', meta, META.HOT_UNTIL)
  if hot_until and trigger > tonumber(hot_until) then
    if old then  -- an older life's ended body: getMsg answers the new one, from the log
      redis.call('HDEL', msgs, id)
      redis.call('ZREM', ended, id)
    end
    cold_added(meta, KEYS[11], trigger)
    return {4, 0, new_topic}
  end
end
if old then
  redis.call('ZREM', ended, id)
end

local m = new_message(topic, id, ARGV[2], tonumber(ARGV[10]), trigger, tonumber(ARGV[4]), tonumber(ARGV[5]), 0,
                      tonumber(ARGV[13]), now)
local encoded = cjson.encode(m)
redis.call('HSET', msgs, id, encoded)

-- Wake the scanner that owns this topic when this message is due or expires before anything it
-- is already sleeping towards.
local wake = next_due(expiry, now_us)
wake = (wake < 0) or ((m.expireTime - now) * 1000 < wake)
redis.call('ZADD', expiry, m.expireTime, id)
if m.status == STATUS.READY then
  if push_ready(t, id, m.priority) == 1 then
    redis.call('PUBLISH', ARGV[7], topic)  -- its queue (list or prioritised set) was empty: wake long pollers
  end
else
  local due = next_due(t.waiting, now_us)
  wake = wake or due < 0 or (trigger - now) * 1000 < due
  redis.call('ZADD', t.waiting, trigger, id)
end
if wake then
  redis.call('PUBLISH', ARGV[8], topic)
end
return {1, m.status, new_topic}
