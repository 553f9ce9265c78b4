-- Moves due waiting messages to ready (each at its priority) in triggerTime order and wakes long
-- pollers; one already past its TTL is ended (expired) instead. The scanner's promote_due, and
-- pull, so a consumer that comes for a message the moment it is due need not wait for the scanner.
-- promote(t, stats key, stats interval, now ms, limit, ready channel or nil)
--   -> ids taken, moved, the earliest expireTime of those moved (nil if none): they enter the
--   expiry index as they become ready, and the scanner's TTL timer may be asleep past it
--   t: waiting, ready, prioritised, msgs, expiry, ended, events (keys), actor, retention
-- @include stats
-- @include lateness
-- @include end_message
-- @include set_ready
-- @include due_to_ready
local function promote(t, stats, interval, now, limit, channel)
  local ended_count = 0
  local lateness = {}
  local made_ready = {}
  local earliest
  local ids, moved = due_to_ready(t, t.waiting, now, limit, channel, function(id, m)
    if m.status ~= STATUS.WAITING then
      return false
    end
    if m.expireTime <= now then
      end_message(t, id, m, now, REASON.EXPIRED)
      ended_count = ended_count + 1
      return false
    end
    earliest = math.min(earliest or m.expireTime, m.expireTime)
    set_ready(t, id, m, STATUS.WAITING, REASON.DUE, false, made_ready)
    lateness_add(lateness, now - m.triggerTime)
    return true
  end)
  log_events(t.events, t.actor, made_ready, STATUS.WAITING, REASON.DUE)
  stat_gaps(stats, interval, now, GAP.READY, lateness)  -- the same gaps: promotion lateness
  stat_add(stats, interval, now, COUNTER.READY, moved)
  lateness_flush(stats, now, lateness)
  stat_add(stats, interval, now, COUNTER.END_LIFE, ended_count)
  return ids, moved, earliest
end
