-- Scanner: moves due waiting messages to ready (each at its priority) in triggerTime order and
-- wakes long pollers. One already past its TTL is ended (expired) instead. What it counts goes
-- back to the scanner, which folds a second of calls into the stats hash at once (fold_stats.lua):
-- a busy topic is promoted a few messages a call, hundreds of calls a second.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] events
-- KEYS[7] prioritised
-- ARGV[1] scan_limit: most messages handled per call (DELAYQUEUE_SCANNER_BATCH)
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] ready_channel: published when the ready list goes from empty to non-empty
-- ARGV[5] actor: 'process@host' for the history, '' with the message log off
-- Returns {moved, µs until the next due message (0: more due now, -1: none), Redis' clock (epoch
-- µs), µs until the earliest TTL of the moved messages (-1: none moved), which the scanner's TTL
-- timer must not sleep past, then the stats hash's fields and what to add to each (a max part:
-- the value it must be at least), as includes/lateness.lua's promotion_fields}
-- @include clock
-- @include scan_reply
-- @include promote
local t = {waiting = KEYS[1], ready = KEYS[2], msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[6],
           prioritised = KEYS[7],
           actor = ARGV[5], retention = tonumber(ARGV[2])}
local limit = tonumber(ARGV[1])
local now = clock()
local ids, moved, earliest, ended, lateness = promote(t, now, limit, ARGV[4])
local reply = scan_reply(moved, #ids, limit, t.waiting)
reply[4] = earliest and math.max(earliest * 1000 - reply[3], 0) or -1
for _, value in ipairs(promotion_fields(tonumber(ARGV[3]), now, moved, ended, lateness)) do
  reply[#reply + 1] = value
end
return reply
