-- The reply of a scanner script that took up to `limit` due members of a sorted set:
-- {count, µs until the next is due, Redis' clock then in epoch µs}: 0 µs when it took a full batch
-- (more may be due now), -1 when the set is empty. The clock is read again: the batch may have
-- taken a while, and the scanner sleeps on this (core.clock.wait_seconds says how long).
-- scan_reply(count, ids taken, limit, sorted set key)
-- @include clock
-- @include next_due
local function scan_reply(count, taken, limit, zset)
  local _, now_us = clock()
  if taken == limit then
    return {count, 0, now_us}
  end
  return {count, next_due(zset, now_us), now_us}
end
