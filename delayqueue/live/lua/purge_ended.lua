-- Scanner: drops ended messages whose getMsg retention window has passed.
-- KEYS[1] msgs
-- KEYS[2] ended
-- ARGV[1] scan_limit: most messages handled per call (DELAYQUEUE_SCANNER_BATCH)
-- Returns {purged, µs until the next purge (0: more due now, -1: none), Redis' clock (epoch µs)}
-- @include clock
-- @include scan_reply
local msgs, ended = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[1])
local now = clock()
local ids = redis.call('ZRANGEBYSCORE', ended, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('HDEL', msgs, id)
  redis.call('ZREM', ended, id)
end
return scan_reply(#ids, #ids, limit, ended)
