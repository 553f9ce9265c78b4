-- Scanner: marks a topic retired when it holds nothing (cold messages included) and has seen no
-- send, pull or ack for idle_millis. The next send re-registers it (send.lua sets 'registered'
-- again), which is how the caller knows to put it back in the topic registry if a send raced the
-- retire.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] meta
-- KEYS[6] stats
-- KEYS[7] events
-- KEYS[8] prioritised
-- ARGV[1] idle_millis
-- Returns {1, its share of the namespace's live-message cap, which the caller gives back to the
-- namespace's pool} if the topic was retired, else {0, 0}.
-- @include clock
-- @include ready_queue
local waiting, inflight, msgs, meta, stats, events = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = clock()
-- Messages out of Redis, in the message log only, are held too (its loader works a registered topic).
if redis.call('HEXISTS', meta, META.COLD) == 1
    or redis.call('ZCARD', waiting) > 0 or ready_count({ready = KEYS[2], prioritised = KEYS[8]}) > 0
    or redis.call('ZCARD', inflight) > 0 or redis.call('HLEN', msgs) > 0
    or redis.call('XLEN', events) > 0 then
  return {0, 0}
end
local last_active = tonumber(redis.call('HGET', meta, META.LAST_ACTIVE) or '0')
if now - last_active < tonumber(ARGV[1]) then
  return {0, 0}
end
local share = tonumber(redis.call('HGET', meta, META.LIVE_SHARE) or '0')
redis.call('HDEL', meta, META.REGISTERED, META.LIVE_SHARE)
redis.call('DEL', stats, events)
return {1, share}
