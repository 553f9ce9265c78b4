-- Microseconds until the earliest member of a sorted set (scored in ms) is due, or -1 when it
-- is empty. Measured against the clock in µs, so a scanner sleeping this long wakes at the due
-- millisecond rather than up to a millisecond after it.
-- next_due(sorted set key, now µs)
local function next_due(zset, now_us)
  local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return -1
  end
  local delta = tonumber(first[2]) * 1000 - now_us
  if delta < 0 then
    return 0
  end
  return delta
end
