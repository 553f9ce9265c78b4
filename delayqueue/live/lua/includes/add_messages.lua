-- Adds messages (already in msgs) to the queue structures, one command per structure: a restore,
-- a load or a promotion brings them in hundreds.
-- add_messages(t, messages, ready_channel or nil) -> messages made ready
--   waiting if not made ready, else ready (priority 0, by far the most, with one LPUSH, in the
--   order given); into expiry those it holds (includes/expiring.lua). Given a channel, publishes
--   it (the ready key's name: includes/due_to_ready.lua) if nothing was ready.
--   t: waiting, ready, prioritised, expiry (keys)
-- @include ready_queue
-- @include expiring
-- @include chunked
local function add_messages(t, messages, ready_channel)
  local expiring, due_later, level_zero, made_ready = {}, {}, {}, 0
  local was_empty = ready_channel and ready_count(t) == 0
  for _, m in ipairs(messages) do
    if expires_first(m) then
      expiring[#expiring + 1] = m.expireTime
      expiring[#expiring + 1] = m.msgId
    end
    if m.status ~= STATUS.READY then
      due_later[#due_later + 1] = m.triggerTime
      due_later[#due_later + 1] = m.msgId
    else
      made_ready = made_ready + 1
      if m.priority then
        push_ready(t, m.msgId, m.priority)
      else
        level_zero[#level_zero + 1] = m.msgId
      end
    end
  end
  call_chunked('ZADD', t.expiry, expiring)
  call_chunked('ZADD', t.waiting, due_later)
  call_chunked('LPUSH', t.ready, level_zero)
  if made_ready > 0 and was_empty then
    redis.call('PUBLISH', ready_channel, t.ready)  -- nothing was ready: wake long pollers
  end
  return made_ready
end
