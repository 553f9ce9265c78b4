-- The loader (workers/loader.py): brings one page of cold messages, read from the message log in
-- (triggerTime, row id) order, into Redis ahead of their time, and moves the topic's loaded_to to
-- the page's end in the same step, so a loader killed at any point neither skips nor repeats a page.
-- A msgId Redis holds live, or holds in this very life (a send that went hot after the watermark
-- rose, a delete's tombstone), is left alone; an older life's ended body is replaced. A message
-- already due (a loader that fell behind) is ready at once, recorded as due.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] meta
-- KEYS[6] events
-- KEYS[7] prioritised
-- KEYS[8] ended
-- KEYS[9] cold_hours
-- ARGV[1] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[2] schedule_channel: published so the topic's scanner looks at the loaded messages
-- ARGV[3] topic
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- ARGV[5] loaded_from: the loaded_to the page was read after ('' for none): another value means
-- another loader moved on meanwhile, and nothing is loaded
-- ARGV[6] loaded_to: the position after this page
-- ARGV[7...] per message: msg_id, stored, trigger_time, expire_time, priority
-- (stored: the message as Redis stores it, waiting; the caller builds it, as a page comes in
-- thousands and cjson would cost the most here)
-- Returns {loaded, already held}, or {-1, 0} when loaded_to was not loaded_from.
-- @include clock
-- @include status
-- @include history
-- @include add_messages
-- @include cold_count
-- @include stored
local msgs, meta, events, ended = KEYS[3], KEYS[5], KEYS[6], KEYS[8]
local t = {waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[7], expiry = KEYS[4]}
local topic = ARGV[3]
if (redis.call('HGET', meta, META.LOADED_TO) or '') ~= ARGV[5] then
  return {-1, 0}
end
local now = clock()
local loaded, held = 0, 0
local changes = {}
-- One command per structure for the page, not one per message, and no table per message: at
-- thousands a page, these cost the most here.
local ids = {}
for i = 7, #ARGV, 5 do
  ids[#ids + 1] = ARGV[i]
end
local held_now = #ids > 0 and redis.call('HMGET', msgs, unpack(ids)) or {}
local stores, expiring, due_later, due_now, triggers = {}, {}, {}, {}, {}
for j, id in ipairs(ids) do
  local i = 7 + (j - 1) * 5
  local stored, existing = ARGV[i + 1], held_now[j]
  local fresh = true
  if existing then
    local old = decode_stored(existing, id)
    if is_live(old) or old.produceTime == decode_stored(stored, id).produceTime then
      held, fresh = held + 1, false
    else
      redis.call('ZREM', ended, id)
    end
  end
  if fresh then
    loaded = loaded + 1
    triggers[loaded] = tonumber(ARGV[i + 2])
    if triggers[loaded] > now then
      if tonumber(ARGV[i + 3]) < triggers[loaded] then  -- its TTL ends first (includes/expiring.lua)
        expiring[#expiring + 1] = ARGV[i + 3]
        expiring[#expiring + 1] = id
      end
      due_later[#due_later + 1] = ARGV[i + 2]
      due_later[#due_later + 1] = id
    else  -- the loader fell behind: ready at once (add_messages below)
      local m = decode_stored(stored, id)
      m.status = STATUS.READY
      stored = encode_stored(m)
      due_now[#due_now + 1] = m
      add_change(changes, id, m)
    end
    stores[#stores + 1] = id
    stores[#stores + 1] = stored
  end
end
redis.call('HSET', meta, META.LOADED_TO, ARGV[6])
if loaded > 0 then
  cold_moved(meta, KEYS[9], loaded, hours_of(triggers))
  redis.call('HSET', msgs, unpack(stores))
  if #expiring > 0 then
    redis.call('ZADD', t.expiry, unpack(expiring))
  end
  if #due_later > 0 then
    redis.call('ZADD', t.waiting, unpack(due_later))
  end
  if add_messages(t, due_now, ARGV[1]) > 0 then
    log_events(events, ARGV[4], changes, STATUS.WAITING, REASON.DUE)
  end
  -- The topic's scanner may be asleep towards a later time.
  redis.call('PUBLISH', ARGV[2], topic)
end
return {loaded, held}
