-- Ends a live message: EXPIRED if it was never delivered, EXHAUSTED otherwise, unless a status
-- is given. The body stays readable (getMsg) until the ended set says to purge it.
-- end_message(t, id, message, now ms, reason, status or nil, changes or nil) -> the new status
--   changes: the change joins it (add_change) for the caller's log_events, instead of its own entry
--   t: msgs, expiry, ended, events (keys), actor, retention (ms the body stays readable)
-- end_messages(t, ids, messages, now ms, reason, status, changes or nil): end_message for many,
--   one command per structure
-- end_reason(message, now ms): why a live message with no time or deliveries left ends
-- @include history
-- @include stored
-- @include chunked
local function end_messages(t, ids, messages, now, reason, status, changes)
  local stores, ended, at = {}, {}, now + t.retention
  for j, id in ipairs(ids) do
    local m = messages[j]
    local from = m.status
    m.status = status
    stores[2 * j - 1], stores[2 * j] = id, encode_stored(m)
    ended[2 * j - 1], ended[2 * j] = at, id
    if changes then
      add_change(changes, id, m)
    else
      log_event(t.events, t.actor, id, m, from, reason)
    end
  end
  call_chunked('HSET', t.msgs, stores)
  call_chunked('ZREM', t.expiry, ids)
  call_chunked('ZADD', t.ended, ended)
end

local function end_message(t, id, m, now, reason, status, changes)
  status = status or ((m.retry == 0) and STATUS.EXPIRED or STATUS.EXHAUSTED)
  end_messages(t, {id}, {m}, now, reason, status, changes)
  return m.status
end

local function end_reason(m, now)
  return (m.expireTime <= now) and REASON.EXPIRED or REASON.RETRIES_EXHAUSTED
end

-- A reader (getMsg, deleteMsg) found a live message past its TTL: it ends now, out of its queue.
-- end_expired(t, id, message, now ms, interval ms)
--   t: as end_message, plus waiting, ready, prioritised, inflight, stats (keys)
-- @include stats
-- @include remove_from_queues
local function end_expired(t, id, m, now, interval)
  remove_from_queues(t, id, m)
  end_message(t, id, m, now, REASON.EXPIRED)
  stat_add(t.stats, interval, now, COUNTER.END_LIFE, 1)
end
