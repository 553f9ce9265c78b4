-- Marks consuming messages as acked (by their consumer, or by a push URL's 2xx answer: history
-- reason 'pushed', with the status as the event's detail). Any other state is left alone. A
-- consumer's acks are recorded as one history entry per call.
-- KEYS[1] inflight
-- KEYS[2] msgs
-- KEYS[3] expiry
-- KEYS[4] ended
-- KEYS[5] stats
-- KEYS[6] meta
-- KEYS[7] events
-- ARGV[1] retention_millis: how long an ended body stays readable
-- ARGV[2] stats_interval_millis
-- ARGV[3] actor: 'process@host' for the history, '' with the message log off
-- ARGV[4] push_status: '' for a consumer's ack; else the push's HTTP status
-- ARGV[5...] per ack: msg_id, retry
--   retry: the retry of the delivery acked ('': any); one delivered again since is left alone
-- Returns per msgId, in order, two values: 1 and the acked status when it was consuming (under
-- that retry, when given), else 0 and its status (0: unknown).
-- @include clock
-- @include take_consuming
-- @include end_message
local t = {inflight = KEYS[1], msgs = KEYS[2], expiry = KEYS[3], ended = KEYS[4], stats = KEYS[5], meta = KEYS[6],
           events = KEYS[7], actor = ARGV[3], retention = tonumber(ARGV[1])}
local now = clock()
local ids, retries = {}, {}
for i = 5, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  retries[#retries + 1] = ARGV[i + 1]
end
count_settles(t, tonumber(ARGV[2]), now, #ids)
local acked, reason = {}, REASON.ACKED
if ARGV[4] ~= '' then  -- a push's ack: its event carries the status, so it gets an entry of its own
  acked, reason = nil, REASON.PUSHED
  set_event_detail(ARGV[4])
end
local taken_ids, taken, found = take_consuming_many(t, ids, retries)
end_messages(t, taken_ids, taken, now, reason, STATUS.ACKED, acked)
local unanswered = {}
for _, id in ipairs(taken_ids) do
  unanswered[id] = true
end
local out = {}
for _, id in ipairs(ids) do
  -- A msgId given twice is acked once; the second answers the status the first gave it.
  out[#out + 1] = unanswered[id] and 1 or 0
  out[#out + 1] = found[id] and found[id].status or 0
  unanswered[id] = nil
end
if acked then
  log_events(t.events, t.actor, acked, STATUS.CONSUMING, REASON.ACKED)
end
return out
