-- The scanner (workers/topic_worker.py): moves the packed lists (includes/packed.lua) of the
-- seconds that begin within pack_lead_millis into the waiting set (ready if already due), oldest
-- second first, at most limit messages a call; then moves loaded_to up to just before the
-- first second left, but no further than now + pack_lead_millis nor than fetched_to: every row up
-- to loaded_to is then in the waiting set, and the API's paths take a row after it as cold.
-- A draining shard (the meta's draining: a shard count the topic gave up) moves every list, so
-- that a lookup by msgId finds its messages; its loaded_to then meets fetched_to.
-- KEYS[1] packed
-- KEYS[2] meta
-- KEYS[3] waiting
-- KEYS[4] ready
-- KEYS[5] prioritised
-- KEYS[6] msgs
-- KEYS[7] expiry
-- KEYS[8] ended
-- KEYS[9] events
-- KEYS[10] cold_hours
-- KEYS[11] stats
-- KEYS[12] released
-- ARGV[1] topic
-- ARGV[2] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[3] actor: 'process@host' for the history, '' with the message log off
-- ARGV[4] pack_lead_millis
-- ARGV[5] limit: most messages moved a call (scripts.UNPACK_PER_CALL for the scanner: a promotion
-- waits behind one call; setTopicConfig's move of a given-up count's lists, the scanner batch)
-- ARGV[6] stats_interval_millis: the messages made ready count as promotions (late ones)
-- Returns {messages moved, µs until the next list is due to move (-1: none; 0: more now), Redis' clock (µs)}
-- @include clock
-- @include cold_count
-- @include packed
-- @include bring_in
local t = {packed = KEYS[1], waiting = KEYS[3], ready = KEYS[4], prioritised = KEYS[5], msgs = KEYS[6],
           expiry = KEYS[7], ready_channel = ARGV[2]}
local meta, ended, events = KEYS[2], KEYS[8], KEYS[9]
local topic, lead, budget = ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[5])
local now, now_us = clock()
-- The lists it moves: those of the seconds up to `upto`; a draining shard's all (false).
local upto = redis.call('HGET', meta, META.DRAINING) ~= '1' and now + lead
local ids, stored, produced, messages = {}, {}, {}, {}
local more = false
for _, second in ipairs(redis.call('ZRANGEBYSCORE', t.packed, '-inf', upto or '+inf')) do
  if budget <= 0 then
    more = true
    break
  end
  local list = packed_list(t, second)
  local entries = redis.call('LPOP', list, budget) or {}
  redis.call('HINCRBY', meta, META.PACKED, -#entries)
  for _, entry in ipairs(entries) do
    local m = packed_message(entry, topic, tonumber(second))
    messages[#messages + 1] = m
    ids[#ids + 1] = m.msgId
    produced[#produced + 1] = m.produceTime
    stored[#stored + 1] = encode_stored(m)
  end
  budget = budget - #entries
  if redis.call('EXISTS', list) == 0 then
    redis.call('ZREM', t.packed, second)
  else
    more = true
  end
end

local moved = 0
if #messages > 0 then
  -- One Redis holds in the same life (a restore brought its row back), or released the body of
  -- since, is left alone: it counts where it is, or has ended. The others were counted cold while packed.
  local fresh = fresh_ids(t.msgs, ended, KEYS[12], ids, produced)
  local items, changes = {}, {}
  for j, m in ipairs(messages) do
    if fresh[j] then
      items[#items + 1] = {m.msgId, stored[j], m.triggerTime, m.expireTime}
    end
  end
  local triggers, late
  moved, triggers, late = bring_in(t, items, now, changes)
  cold_moved(meta, KEYS[10], hours_of(triggers))
  count_late(KEYS[11], tonumber(ARGV[6]), now, late)
  log_events(events, ARGV[3], changes, STATUS.WAITING, REASON.DUE)
end

local first = redis.call('ZRANGE', t.packed, 0, 0, 'WITHSCORES')
local bound = upto
if first[1] then
  bound = math.min(upto or math.huge, tonumber(first[2]) - 1)
end
local at = redis.call('HMGET', meta, META.LOADED_TO, META.FETCHED_TO)
if at[1] and at[2] then
  local target = at[2]
  if bound and position_before(bound .. ':' .. END_OF_MILLI, target) then
    target = bound .. ':' .. END_OF_MILLI
  end
  if position_before(at[1], target) then
    redis.call('HSET', meta, META.LOADED_TO, target)
  end
end

local next_due = -1
if more then
  next_due = 0
elseif first[1] then  -- (a draining shard has a list left only when `more`)
  next_due = math.max(tonumber(first[2]) - lead - now, 0) * 1000
end
return {moved, next_due, now_us}
