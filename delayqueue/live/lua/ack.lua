-- Marks a consuming message as acked (by its consumer, or by its push URL's 2xx answer: history
-- reason 'pushed', with the status as the event's detail). Any other state is left alone.
-- KEYS[1] inflight
-- KEYS[2] msgs
-- KEYS[3] expiry
-- KEYS[4] ended
-- KEYS[5] stats
-- KEYS[6] meta
-- KEYS[7] events
-- ARGV[1] msg_id
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- ARGV[5] push_status: '' for a consumer's ack; else the push's HTTP status
-- Returns {1, acked status} when it was consuming, else {0, its status (0: unknown)}.
-- @include clock
-- @include take_consuming
-- @include end_message
local t = {inflight = KEYS[1], msgs = KEYS[2], expiry = KEYS[3], ended = KEYS[4], stats = KEYS[5], meta = KEYS[6],
           events = KEYS[7], actor = ARGV[4], retention = tonumber(ARGV[2])}
local id = ARGV[1]
local now = clock()
local m, status = take_consuming(t, tonumber(ARGV[3]), now, id)
if not m then
  return {0, status}
end
if ARGV[5] == '' then
  return {1, end_message(t, id, m, now, REASON.ACKED, STATUS.ACKED)}
end
set_event_detail(ARGV[5])
return {1, end_message(t, id, m, now, REASON.PUSHED, STATUS.ACKED)}
