-- Scanner: marks a topic (or a shard of one) retired when it holds nothing (cold messages included)
-- and has seen no send, pull or ack for idle_millis. The next send re-registers it (send.lua sets
-- 'registered' again), which is how the caller knows to put it back in the topic registry if a send
-- raced the retire.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] meta
-- KEYS[6] stats
-- KEYS[7] events
-- KEYS[8] prioritised
-- ARGV[1] idle_millis
-- ARGV[2] dry_run: 1 only answers whether it would retire it
-- ARGV[3] cold: '' for an unsharded topic, held while it has a count of cold messages at all; for a
-- shard of a sharded topic, '=' and its part of the topic's count (raise_hot.lua) as the caller
-- read it ('=' alone: none), held if the part moved since: a send went cold after the caller
-- found no cold message in the message log; '*' (a dry run's) does not look at it
-- Returns {1, its share of the namespace's live-message cap, which the caller gives back to the
-- namespace's pool, its part of the cold count ('' for none)} if the topic was retired (or would
-- be), else {0, 0, that part}.
-- @include clock
-- @include ready_queue
local waiting, inflight, msgs, meta, stats, events = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = clock()
local cold = redis.call('HGET', meta, META.COLD) or ''
-- Messages out of Redis, in the message log only, are held too (its loader works a registered topic).
if (ARGV[3] == '' and cold ~= '') or (ARGV[3] ~= '' and ARGV[3] ~= '*' and ARGV[3] ~= '=' .. cold)
    or redis.call('ZCARD', waiting) > 0 or ready_count({ready = KEYS[2], prioritised = KEYS[8]}) > 0
    or redis.call('ZCARD', inflight) > 0 or redis.call('HLEN', msgs) > 0
    or redis.call('XLEN', events) > 0 then
  return {0, 0, cold}
end
local last_active = tonumber(redis.call('HGET', meta, META.LAST_ACTIVE) or '0')
if now - last_active < tonumber(ARGV[1]) then
  return {0, 0, cold}
end
local share = tonumber(redis.call('HGET', meta, META.LIVE_SHARE) or '0')
if ARGV[2] ~= '1' then
  redis.call('HDEL', meta, META.REGISTERED, META.LIVE_SHARE)
  redis.call('DEL', stats, events)
end
return {1, share, cold}
