-- Puts messages from the message log back into Redis after a loss: waiting if not yet due,
-- ready otherwise (an in-flight one is ready again), with its logged times and retry count.
-- A msgId Redis still holds, in any status, is left alone: Redis is the fresher record.
-- KEYS: waiting, ready, msgs, expiry, meta, events
-- ARGV: readyChannel, scheduleChannel, topic, dryRun (1|0), actor, then per message:
--       msgId, payload, produceTime, triggerTime, expireTime, maxRetry, retry
-- Returns {restored, already held}
-- @include common
local waiting, ready, msgs, expiry, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
EVENTS, ACTOR = KEYS[6], ARGV[5]
local topic = ARGV[3]
local dry_run = ARGV[4] == '1'
local now = clock()
local restored, held = 0, 0
-- Members are gathered and added with one command per structure: restores come in hundreds.
local expiring, due_later, due_now, changes = {}, {}, {}, {}
for i = 6, #ARGV, 7 do
  local id = ARGV[i]
  if dry_run then
    if redis.call('HEXISTS', msgs, id) == 1 then
      held = held + 1
    else
      restored = restored + 1
    end
  else
    local m = {
      topic = topic,
      msgId = id,
      msg = ARGV[i + 1],
      produceTime = tonumber(ARGV[i + 2]),
      triggerTime = tonumber(ARGV[i + 3]),
      expireTime = tonumber(ARGV[i + 4]),
      maxRetry = tonumber(ARGV[i + 5]),
      retry = tonumber(ARGV[i + 6]),
    }
    m.status = (m.triggerTime <= now) and 2 or 1
    if redis.call('HSETNX', msgs, id, cjson.encode(m)) == 0 then
      held = held + 1
    else
      restored = restored + 1
      expiring[#expiring + 1] = m.expireTime
      expiring[#expiring + 1] = id
      if m.status == 2 then
        due_now[#due_now + 1] = id
      else
        due_later[#due_later + 1] = m.triggerTime
        due_later[#due_later + 1] = id
      end
      changes[#changes + 1] = {id, m.status, m.retry, m.produceTime}
    end
  end
end
if restored > 0 and not dry_run then
  redis.call('ZADD', expiry, unpack(expiring))
  if #due_later > 0 then
    redis.call('ZADD', waiting, unpack(due_later))
  end
  if #due_now > 0 and redis.call('LPUSH', ready, unpack(due_now)) == #due_now then
    redis.call('PUBLISH', ARGV[1], topic)  -- the list was empty: wake long pollers
  end
  redis.call('HSET', meta, 'last_active', now)
  redis.call('HSETNX', meta, 'registered', 1)
  -- The topic's scanner may be asleep towards a later time, or not know the topic yet.
  redis.call('PUBLISH', ARGV[2], topic)
  log_events(changes, 0, 'restored')
end
return {restored, held}
