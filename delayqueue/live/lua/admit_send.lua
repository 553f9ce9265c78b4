-- Admits up to `wanted` new messages to a topic that has limits, before the message log is
-- written: room under its live-message cap (live_count), then a token each from its produce
-- bucket. send.lua checks the cap again, as each message goes in, so concurrent sends cannot
-- pass it; this check spares the log the rows of sends that would be refused.
-- KEYS[1] buckets
-- KEYS[2] waiting
-- KEYS[3] ready
-- KEYS[4] prioritised
-- KEYS[5] inflight
-- KEYS[6] meta
-- ARGV[1] wanted
-- ARGV[2] produce_rate: messages a second, 0 for no rate limit
-- ARGV[3] max_live: 0 for no cap
-- Returns {admitted, within the cap, ms until the produce bucket holds what it refused (0 if nothing)}:
-- the first `admitted` messages go; up to `within the cap` the rate refused the rest, beyond it the cap.
-- @include clock
-- @include token_bucket
-- @include cold_count
local buckets = KEYS[1]
local queues = {waiting = KEYS[2], ready = KEYS[3], prioritised = KEYS[4], inflight = KEYS[5]}
local wanted, rate, max_live = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local within_cap = wanted
if max_live > 0 then
  within_cap = math.max(math.min(wanted, max_live - live_count(queues, KEYS[6])), 0)
end
if rate == 0 or within_cap == 0 then
  return {within_cap, within_cap, 0}
end
local _, now_us = clock()
local tokens = bucket_level(buckets, BUCKET.PRODUCE, rate, now_us)
local admitted = math.min(within_cap, math.floor(tokens))
bucket_store(buckets, BUCKET.PRODUCE, tokens - admitted, now_us)
if admitted < within_cap then
  return {admitted, within_cap, bucket_wait(tokens - admitted, within_cap - admitted, rate)}
end
return {admitted, within_cap, 0}
