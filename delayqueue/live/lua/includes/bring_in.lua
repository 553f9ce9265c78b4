-- Messages coming into Redis from outside its queues (a page of cold ones, a packed list), with
-- one command per structure for all of them, not one per message: at thousands a call, these
-- cost the most.
-- fresh_ids(msgs, ended, released, ids, produced) -> per id whether it comes in (a msgId Redis holds
--   live, or holds in this very life, the same produceTime, is left alone: a send that went to Redis
--   meanwhile, a delete's tombstone, a life deleteMsg released the body of, whose log row may read
--   waiting yet; an older life's ended body is replaced), and how many are held
--   produced[j]: the produceTime of ids[j]'s message
-- bring_in(t, items, now, changes) -> how many came in, their triggerTimes, the lateness
--   accumulator of those made ready (includes/lateness.lua: late, as a promotion is)
--   items: {id, stored, triggerTime, expireTime} each, held by nothing live: waiting if not yet due,
--   ready otherwise (recorded as due in changes, for the caller's log_events)
--   t: msgs, waiting, ready, prioritised, expiry (keys), ready_channel
-- count_late(stats key, interval ms, now ms, accumulator): those made ready, counted as promotions
-- @include status
-- @include stored
-- @include history
-- @include add_messages
-- @include lateness
local function fresh_ids(msgs, ended, released, ids, produced)
  local held_now = #ids > 0 and redis.call('HMGET', msgs, unpack(ids)) or {}
  local fresh, held = {}, 0
  for j, id in ipairs(ids) do
    fresh[j] = true
    local existing = held_now[j]
    if existing then
      local old = decode_stored(existing, id)
      if is_live(old) or old.produceTime == produced[j] then
        held, fresh[j] = held + 1, false
      else
        redis.call('ZREM', ended, id)
      end
    elseif redis.call('ZSCORE', released, id .. ':' .. produced[j]) then
      held, fresh[j] = held + 1, false
    end
  end
  return fresh, held
end

local function bring_in(t, items, now, changes)
  local stores, added, triggers, late = {}, {}, {}, {}
  for n, item in ipairs(items) do
    local id, stored, trigger, expire = item[1], item[2], item[3], item[4]
    triggers[n] = trigger
    -- What add_messages reads of a waiting message; one brought in late is ready at once.
    local m = {msgId = id, triggerTime = trigger, expireTime = expire, status = STATUS.WAITING}
    if trigger <= now then
      m = decode_stored(stored, id)
      m.status = STATUS.READY
      stored = encode_stored(m)
      add_change(changes, id, m)
      lateness_add(late, now - trigger)
    end
    added[n] = m
    stores[#stores + 1] = id
    stores[#stores + 1] = stored
  end
  if #items > 0 then
    redis.call('HSET', t.msgs, unpack(stores))
    add_messages(t, added, t.ready_channel)
  end
  return #items, triggers, late
end

local function count_late(stats, interval, now, late)
  fold_fields(stats, promotion_fields(interval, now, late.count or 0, 0, late))
end
