-- Takes up to `wanted` tokens from a namespace's rate bucket: one per message sent or handed
-- out. A negative `wanted` gives tokens back (taken for messages that then did not go), to a
-- namespace's bucket or a topic's.
-- KEYS[1] buckets
-- ARGV[1] kind: a BUCKET
-- ARGV[2] wanted
-- ARGV[3] rate: tokens a second
-- Returns {tokens granted, ms until the bucket holds what was refused (0 when nothing was)}
-- @include clock
-- @include token_bucket
local buckets, kind = KEYS[1], ARGV[1]
local wanted, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
local _, now_us = clock()
local tokens = bucket_level(buckets, kind, rate, now_us)
if wanted < 0 then
  bucket_store(buckets, kind, math.min(tokens - wanted, rate * BURST_MILLIS / 1000), now_us)
  return {0, 0}
end
local granted = math.min(wanted, math.floor(tokens))
bucket_store(buckets, kind, tokens - granted, now_us)
if granted < wanted then
  return {granted, bucket_wait(tokens - granted, wanted - granted, rate)}
end
return {granted, 0}
