-- Scanner: keeps only the current and the previous monitor interval in a topic's stats
-- hash, so getMonitorData always reads one complete, cluster-wide interval.
-- KEYS: stats
-- ARGV: statsIntervalMillis
-- Returns the number of fields removed.
-- @include common
local stats = KEYS[1]
local current = math.floor(clock() / tonumber(ARGV[1]))
local removed = 0
for _, field in ipairs(redis.call('HKEYS', stats)) do
  local index = tonumber(string.match(field, '^(%d+):'))
  if index == nil or index < current - 1 then
    redis.call('HDEL', stats, field)
    removed = removed + 1
  end
end
return removed
