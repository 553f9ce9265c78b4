-- Moves due waiting messages to ready (each at its priority) in triggerTime order and wakes long
-- pollers; one already past its TTL is ended (expired) instead. The scanner's promote_due, and
-- pull, so a consumer that comes for a message the moment it is due need not wait for the scanner.
-- One command per structure for the whole call, not one per message: a busy topic promotes tens
-- to thousands a call. What it counts is the caller's to write (includes/lateness.lua's
-- promotion_fields): the scanner gathers a second of calls into one write.
-- promote(t, now ms, limit, ready channel or nil)
--   -> ids taken, moved, the earliest expireTime of those moved (nil if none: they enter the
--   expiry index as they become ready, and the scanner's TTL timer may be asleep past it), ended
--   (expired instead), the lateness accumulator of those moved (includes/lateness.lua)
--   t: waiting, ready, prioritised, msgs, expiry, ended, events (keys), actor, retention
-- @include lateness
-- @include end_message
-- @include take_due
-- @include add_messages
local function promote(t, now, limit, channel)
  local ids = redis.call('ZRANGEBYSCORE', t.waiting, '-inf', now, 'LIMIT', 0, limit)
  local ended, lateness, changes, ready, stores = 0, {}, {}, {}, {}
  if #ids == 0 then  -- the common case: nothing due, nothing more to read
    return ids, 0, nil, ended, lateness
  end
  local earliest
  take_due(t.waiting, t.msgs, ids, function(id, m, raw)
    if m.status ~= STATUS.WAITING then
      return
    end
    if m.expireTime <= now then
      end_message(t, id, m, now, REASON.EXPIRED)
      ended = ended + 1
      return
    end
    earliest = math.min(earliest or m.expireTime, m.expireTime)
    m.status = STATUS.READY
    ready[#ready + 1] = m
    stores[#stores + 1] = id
    stores[#stores + 1] = stored_with_status(raw, m)
    add_change(changes, id, m)
    lateness_add(lateness, now - m.triggerTime)
  end)
  call_chunked('HSET', t.msgs, stores)
  local moved = add_messages(t, ready, channel)
  log_events(t.events, t.actor, changes, STATUS.WAITING, REASON.DUE)
  return ids, moved, earliest, ended, lateness
end
