-- The loader (workers/loader.py): brings one page of cold messages, read from the message log in
-- (triggerTime, row id) order, into Redis ahead of their time, and moves the topic's fetched_to to
-- the page's end in the same step, so a loader killed at any point neither skips nor repeats a page.
-- A message due more than twice pack_lead_millis ahead is packed (includes/packed.lua: it stays
-- counted cold until the scanner moves its list in); the others go into the waiting set. While no
-- list is left, loaded_to moves with fetched_to (every row up to there is then in the waiting set).
-- A msgId Redis holds live, or holds in this very life (a send that went hot after the watermark
-- rose, a delete's tombstone, a life deleteMsg released the body of), is left alone; an older
-- life's ended body is replaced. A message already due (a loader that fell behind) is ready at
-- once, recorded as due.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] meta
-- KEYS[6] events
-- KEYS[7] prioritised
-- KEYS[8] ended
-- KEYS[9] cold_hours
-- KEYS[10] packed
-- KEYS[11] stats
-- KEYS[12] cold_sent
-- KEYS[13] released
-- ARGV[1] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[2] schedule_channel: published so the topic's scanner looks at the loaded messages
-- ARGV[3] topic
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- ARGV[5] loaded_from: the fetched_to (or loaded_to, without one) the page was read after ('' for
-- none): another value means another loader moved on meanwhile, and nothing is loaded
-- ARGV[6] loaded_to: the position after this page
-- ARGV[7] pack_lead: the packed lists' lead, ms (0 packs nothing; nor does a draining shard, whose
-- loader may not know yet that the topic gave its count up)
-- ARGV[8] in_flight_millis: a message produced less than this long ago is not packed (0: any is): its
-- send's script may run after this one, and would pack it again; in msgs, it finds it live. Nor is it
-- counted out of the cold ones unless its send counted it in (cold_sent): a script that runs after
-- this one finds it held and counts nothing
-- ARGV[9] stats_interval_millis: the messages made ready count as promotions (late ones)
-- ARGV[10...] per message: msg_id, stored, trigger_time, expire_time, priority, produce_time
-- (stored: the message as Redis stores it, waiting; the caller builds it, as a page comes in
-- thousands and cjson would cost the most here)
-- Returns {loaded into the waiting set or ready, already held, packed, of the loaded those counted out
-- of the cold count}, or {-1, 0, 0, 0} when the position was not loaded_from.
-- @include clock
-- @include cold_count
-- @include packed
-- @include bring_in
local msgs, meta, events, ended = KEYS[3], KEYS[5], KEYS[6], KEYS[8]
local t = {waiting = KEYS[1], ready = KEYS[2], prioritised = KEYS[7], expiry = KEYS[4], msgs = msgs,
           packed = KEYS[10], meta = meta, ready_channel = ARGV[1]}
local topic, pack_lead, in_flight = ARGV[3], tonumber(ARGV[7]), tonumber(ARGV[8])
local position = redis.call('HMGET', meta, META.FETCHED_TO, META.LOADED_TO, META.DRAINING)
if (position[1] or position[2] or '') ~= ARGV[5] then
  return {-1, 0, 0, 0}
end
if position[3] == '1' then
  pack_lead = 0
end
local now = clock()
local first_item, item_size = 10, 6
local ids, stored, produced = {}, {}, {}
for i = first_item, #ARGV, item_size do
  ids[#ids + 1] = ARGV[i]
  stored[#stored + 1] = ARGV[i + 1]
  produced[#produced + 1] = tonumber(ARGV[i + 5])
end
local fresh, held = fresh_ids(msgs, ended, KEYS[13], ids, produced)
local items, changes, packing, packing_ids = {}, {}, {}, {}
local counted = {}  -- the triggerTimes of the items counted in the cold count
for j, id in ipairs(ids) do
  if fresh[j] then
    local at = first_item + (j - 1) * item_size
    local trigger = tonumber(ARGV[at + 2])
    local young = in_flight > 0 and tonumber(ARGV[at + 5]) > now - in_flight
    local m = pack_lead > 0 and trigger > now + 2 * pack_lead and decode_stored(stored[j], id)
    if m and packable(m) and not young then
      packing[#packing + 1] = m
      packing_ids[#packing_ids + 1] = id
    else
      items[#items + 1] = {id, stored[j], trigger, tonumber(ARGV[at + 3])}
      if not young or redis.call('ZREM', KEYS[12], id) == 1 then
        counted[#counted + 1] = trigger
      end
    end
  end
end
if #packing_ids > 0 then  -- an older life's ended body: getMsg answers the new one, from the log
  redis.call('HDEL', msgs, unpack(packing_ids))
end
local first_packed = pack(t, packing)
redis.call('HSET', meta, META.FETCHED_TO, ARGV[6])
if redis.call('EXISTS', t.packed) == 0 then
  redis.call('HSET', meta, META.LOADED_TO, ARGV[6])
end
local loaded, _, late = bring_in(t, items, now, changes)
local counted_out = 0
if loaded > 0 then
  counted_out = cold_moved(meta, KEYS[9], hours_of(counted))
  count_late(KEYS[11], tonumber(ARGV[9]), now, late)
  log_events(events, ARGV[4], changes, STATUS.WAITING, REASON.DUE)
end
if loaded > 0 or first_packed then
  -- The topic's scanner may be asleep towards a later time.
  redis.call('PUBLISH', ARGV[2], topic)
end
return {loaded, held, #packing, counted_out}
