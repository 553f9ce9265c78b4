-- Scanner: keeps only the current and the previous monitor interval in a topic's stats hash, so
-- getMonitorData always reads one complete, cluster-wide interval, and the last CHART_MINUTES
-- of the per-minute lateness series. Lifetime totals and the histogram stay.
-- KEYS[1] stats
-- ARGV[1] stats_interval_millis
-- Returns the number of fields removed.
-- @include clock
local stats = KEYS[1]
local now = clock()
local current = math.floor(now / tonumber(ARGV[1]))
local first_minute = math.floor(now / 60000) - CHART_MINUTES
local removed = 0
for _, field in ipairs(redis.call('HKEYS', stats)) do
  local index = tonumber(string.match(field, STATS_INTERVAL_PATTERN))
  local minute = tonumber(string.match(field, STATS_MINUTE_PATTERN))
  if (index and index < current - 1) or (minute and minute < first_minute) then
    redis.call('HDEL', stats, field)
    removed = removed + 1
  end
end
return removed
