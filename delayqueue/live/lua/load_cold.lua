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
-- ARGV[1] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[2] schedule_channel: published so the topic's scanner looks at the loaded messages
-- ARGV[3] topic
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- ARGV[5] loaded_from: the loaded_to the page was read after ('' for none): another value means
-- another loader moved on meanwhile, and nothing is loaded
-- ARGV[6] loaded_to: the position after this page
-- ARGV[7...] per message: msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, priority
-- Returns {loaded, already held}, or {-1, 0} when loaded_to was not loaded_from.
-- @include clock
-- @include status
-- @include history
-- @include add_messages
-- @include new_message
local msgs, meta, events, ended = KEYS[3], KEYS[5], KEYS[6], KEYS[8]
local t = {waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[7], expiry = KEYS[4]}
local topic = ARGV[3]
if (redis.call('HGET', meta, META.LOADED_TO) or '') ~= ARGV[5] then
  return {-1, 0}
end
local now = clock()
local loaded, held = 0, 0
local added, changes = {}, {}
for i = 7, #ARGV, 8 do
  local id, produce = ARGV[i], tonumber(ARGV[i + 2])
  local existing = redis.call('HGET', msgs, id)
  local old = existing and cjson.decode(existing)
  if old and (is_live(old) or old.produceTime == produce) then
    held = held + 1
  else
    if old then
      redis.call('ZREM', ended, id)
    end
    local m = new_message(topic, id, ARGV[i + 1], produce, tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]),
                          tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7]), now)
    redis.call('HSET', msgs, id, cjson.encode(m))
    loaded = loaded + 1
    added[#added + 1] = m
    if m.status == STATUS.READY then
      add_change(changes, id, m)
    end
  end
end
redis.call('HSET', meta, META.LOADED_TO, ARGV[6])
if loaded > 0 then
  if add_messages(t, added, ARGV[1], topic) > 0 then
    log_events(events, ARGV[4], changes, STATUS.WAITING, REASON.DUE)
  end
  -- The topic's scanner may be asleep towards a later time.
  redis.call('PUBLISH', ARGV[2], topic)
end
return {loaded, held}
