-- Scanner: ends live messages whose TTL passed (expired if never delivered, else exhausted)
-- and takes them out of whichever queue structure holds them.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] stats
-- KEYS[8] events
-- KEYS[9] prioritised
-- ARGV[1] scan_limit: most messages handled per call (DELAYQUEUE_SCANNER_BATCH)
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- Returns {expired, µs until the next expiry (0: more due now, -1: none), Redis' clock (epoch µs)}
-- @include clock
-- @include stats
-- @include status
-- @include end_message
-- @include remove_from_queues
-- @include scan_reply
-- @include take_due
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], msgs = KEYS[4], expiry = KEYS[5],
           ended = KEYS[6], events = KEYS[8], prioritised = KEYS[9],
           actor = ARGV[4], retention = tonumber(ARGV[2])}
local limit = tonumber(ARGV[1])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', t.expiry, '-inf', now, 'LIMIT', 0, limit)
local expired = 0
take_due(t.expiry, t.msgs, ids, function(id, m)
  if is_live(m) then
    remove_from_queues(t, id, m)
    end_message(t, id, m, now, REASON.EXPIRED)
    expired = expired + 1
  end
end)
stat_add(KEYS[7], tonumber(ARGV[3]), now, COUNTER.END_LIFE, expired)
return scan_reply(expired, #ids, limit, t.expiry)
