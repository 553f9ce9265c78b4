-- Scanner: drops ended messages (4-7) whose getMsg retention window has passed.
-- KEYS: msgs, ended
-- ARGV: limit
-- Returns {purged, µs until the next purge (0: more due now, -1: none)}
-- @include common
local msgs, ended = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[1])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', ended, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('HDEL', msgs, id)
  redis.call('ZREM', ended, id)
end
if #ids == limit then
  return {#ids, 0}
end
-- The clock again: the loop above may have taken a while, and the scanner sleeps on this.
return {#ids, next_due(ended, select(2, clock()))}
