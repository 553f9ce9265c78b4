-- Accepts messages of one topic, each as a send of its own would, in order: waiting if it is not
-- yet due by Redis' clock, ready otherwise. A live duplicate msgId enqueues nothing and answers
-- the stored message; so does the msgId of a message that ended less than dedupe_window_millis ago
-- (a retried send must not deliver twice: Redis answers for as long as it keeps ended messages,
-- the message log beyond that); one that ended earlier starts afresh. A live duplicate past its
-- TTL ends now (expired) and counts as ended. Their times come from the caller, which wrote the
-- same times to the message log first, with the 'sent' history rows (so this script records no
-- event for the messages it enqueues). What every message of a call shares (the clock, the
-- topic's meta, its counters, the scanner's next wake) is read and written once per call: a batch
-- costs Redis a third of what as many calls of one message cost.
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
-- KEYS[12] packed
-- KEYS[13] cold_sent
-- ARGV[1] topic
-- ARGV[2] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[3] schedule_channel: published when a message is due or expires before what the scanner expects
-- ARGV[4] stats_interval_millis
-- ARGV[5] max_live: the topic's live-message cap, 0 for none
-- ARGV[6] namespace_capped: 1 when the namespace has a live-message cap (the topic's share of it
-- is then a cap too, see borrow_live.lua)
-- ARGV[7] retention_millis: how long an ended body stays readable (the ended set's scores are the
-- end plus this)
-- ARGV[8] actor: 'process@host' for the history, '' with the message log off
-- ARGV[9] dedupe_window_millis: an ended message's msgId stays taken this long after its end (0: a
-- redrive's new life replaces its dead letter)
-- ARGV[10] cold_tier: 1 leaves a message due after the meta's hot_until in the message log only
-- (the loader brings it in ahead of its time)
-- ARGV[11] pack_lead_millis: above 0, a message due more than twice this far ahead, between the
-- meta's loaded_to and fetched_to (where the loader has read the log), is packed (includes/packed.lua)
-- ARGV[12...] per message: msg_id, payload, trigger_time, expire_time, max_retry, produce_time, priority, logged_waiting
-- (trigger_time not before produce_time, the sending process' clock; times in epoch ms; priority
-- 0-9, higher pulled first, kept in the message only when above 0; logged_waiting '' or the
-- triggerTime of the waiting message the message log holds under the msgId: if Redis does not
-- hold it live and it is due at or after the loader's loaded_to, it is cold (or on its way in),
-- and this send is its duplicate, unless it is before fetched_to and in no packed list (cold_row);
-- any other is a row the log writer has not caught up with (Redis ended the message))
-- Returns {newTopic (1|0), Redis' clock in µs (when each life this call creates began: it orders a
-- msgId's lives for the message log, where web clocks cannot), then per message two values}: 1,
-- status when created (the caller has the rest of the message); 0, the message json for a live
-- duplicate or one ended within the window; 2, 0 when the topic holds max_live live messages
-- already, or 3, 0 when it holds its share of the namespace's cap (nothing enqueued in either); 4, 0
-- when created cold (in the log only); 5, 0 for a duplicate of the log's live message.
-- @include clock
-- @include stats
-- @include status
-- @include next_due
-- @include remove_from_queues
-- @include ready_queue
-- @include new_message
-- @include end_message
-- @include cold_count
-- @include expiring
-- @include packed
-- @include stored
local msgs, expiry, ended, meta, stats = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local topic, interval, retention = ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[7])
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], prioritised = KEYS[9], msgs = msgs,
           expiry = expiry, ended = ended, stats = stats, events = KEYS[10], actor = ARGV[8], retention = retention,
           packed = KEYS[12], meta = meta}
local max_live, namespace_capped = tonumber(ARGV[5]), ARGV[6] == '1'
local dedupe_window, cold_tier, pack_lead = tonumber(ARGV[9]), ARGV[10] == '1', tonumber(ARGV[11])
local now, now_us = clock()
local first_item, item_size = 12, 8
local count = (#ARGV - first_item + 1) / item_size

redis.call('HSET', meta, META.LAST_ACTIVE, now)
-- 'registered' is 0 from the topic's first send until its caller has registered it
-- (confirm_registered.lua): a registration that failed is made by the next send.
local new_topic = redis.call('HGET', meta, META.REGISTERED) ~= '1' and 1 or 0
if new_topic == 1 then
  redis.call('HSETNX', meta, META.REGISTERED, 0)
end
stat_add(stats, interval, now, COUNTER.SEND, count)

-- What the scanner sleeps towards (µs from now, -1: nothing), before these messages: it is woken
-- once if any of them is due or expires before that.
local waiting_due = next_due(t.waiting, now_us)
local expiry_due  -- read when a message first goes into the index (a waiting one does not)
local wake, woken_pollers = false, false
local hot_until, loaded_to, fetched_to  -- the meta's, read once when first needed (no message here changes them)
local to_pack = {}
local went_cold = false

-- The times of the meta's loaded_to and fetched_to (false for none); no fetched_to in a draining
-- shard (a shard count the topic gave up), which packs nothing.
local function positions()
  if loaded_to == nil then
    local values = redis.call('HMGET', meta, META.LOADED_TO, META.FETCHED_TO, META.DRAINING)
    loaded_to = tonumber(string.match(values[1] or '', '^[^:]*')) or false
    fetched_to = values[3] ~= '1' and tonumber(string.match(values[2] or '', '^[^:]*')) or false
  end
  return loaded_to, fetched_to
end

-- One message: its reply's two values.
local function send_one(id, payload, trigger, expire_time, max_retry, produce_time, priority, logged_waiting)
  local existing = redis.call('HGET', msgs, id)
  local old = existing and decode_stored(existing, id)
  if old and is_live(old) then
    if old.expireTime > now then
      return 0, wire_json(existing, id)
    end
    end_expired(t, id, old, now, interval)  -- past its TTL: it ends (a dead letter), as a scan would end it
    existing = cjson.encode(old)
  end
  if old then
    local purge_at = redis.call('ZSCORE', ended, id)
    if purge_at and tonumber(purge_at) - retention + dedupe_window > now then
      return 0, wire_json(existing, id)
    end
  end
  if logged_waiting ~= '' and not (old and is_live(old)) then
    local loaded = positions()
    if loaded and tonumber(logged_waiting) >= loaded and cold_row(t, id, tonumber(logged_waiting)) then
      return 5, 0
    end
  end
  -- The caps hold exactly, whatever runs concurrently (an ended message is in no count).
  if max_live > 0 or namespace_capped then
    local live = live_count(t, meta)
    if max_live > 0 and live >= max_live then
      return 2, 0
    end
    if namespace_capped and live >= tonumber(redis.call('HGET', meta, META.LIVE_SHARE) or '0') then
      return 3, 0
    end
  end
  if cold_tier and trigger > now then
    hot_until = hot_until or redis.call('HGET', meta, META.HOT_UNTIL) or ''
    if hot_until ~= '' and trigger > tonumber(hot_until) then
      if old then  -- an older life's ended body: getMsg answers the new one, from the log
        redis.call('HDEL', msgs, id)
        redis.call('ZREM', ended, id)
      end
      -- A loader that read the row before this script ran brings it in counting it out: only if counted here.
      -- A restore that read the row before this script ran counted it, and noted it so.
      if tonumber(redis.call('ZSCORE', KEYS[13], id)) ~= produce_time then
        cold_added(meta, KEYS[11], trigger)
        redis.call('ZADD', KEYS[13], produce_time, id)
      end
      went_cold = true
      return 4, 0
    end
  end
  local m = new_message(topic, id, payload, produce_time, trigger, expire_time, max_retry, 0, priority, now)
  if pack_lead > 0 and trigger > now + 2 * pack_lead and packable(m) then
    local loaded, fetched = positions()
    if loaded and fetched and trigger > loaded and trigger < fetched then
      if old then  -- as a cold send
        redis.call('HDEL', msgs, id)
        redis.call('ZREM', ended, id)
      end
      cold_added(meta, KEYS[11], trigger)
      to_pack[#to_pack + 1] = m  -- packed after the loop, a command per second of due time
      return 1, m.status
    end
  end
  if old then
    redis.call('ZREM', ended, id)
  end

  redis.call('HSET', msgs, id, encode_stored(m))
  if expires_first(m) then
    expiry_due = expiry_due or next_due(expiry, now_us)
    wake = wake or expiry_due < 0 or (m.expireTime - now) * 1000 < expiry_due
    redis.call('ZADD', expiry, m.expireTime, id)
  end
  if m.status == STATUS.READY then
    if push_ready(t, id, m.priority) == 1 then
      woken_pollers = true  -- its queue (list or prioritised set) was empty: wake long pollers
    end
  else
    wake = wake or waiting_due < 0 or (trigger - now) * 1000 < waiting_due
    redis.call('ZADD', t.waiting, trigger, id)
  end
  return 1, m.status
end

local reply = {new_topic, now_us}
for i = first_item, #ARGV, item_size do
  local code, value = send_one(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]),
                               tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6]), ARGV[i + 7])
  reply[#reply + 1] = code
  reply[#reply + 1] = value
end
wake = pack(t, to_pack) or wake  -- the scanner moves each list in ahead of its second
if went_cold then  -- the loader asks only about sends younger than this
  redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', '(' .. (now - IN_FLIGHT_MILLIS))
  redis.call('PEXPIRE', KEYS[13], 2 * IN_FLIGHT_MILLIS)
end
if woken_pollers then
  redis.call('PUBLISH', ARGV[2], t.ready)
end
if wake then
  redis.call('PUBLISH', ARGV[3], topic)
end
return reply
