-- Monitor counters, one hash per topic with a field per interval and counter, so every process
-- adds to the same figures and the previous interval can be read back whole; a lifetime total
-- beside them for Prometheus counters. Field names: live/stats.py (the prelude's stats_field_*).
-- stat_add(stats key, interval ms, now ms, COUNTER name, amount)
-- stat_gap(stats key, interval ms, now ms, GAP name, gap ms): count, sum and max of the interval
local function stat_add(stats, interval, now, name, n)
  if n ~= 0 then
    redis.call('HINCRBY', stats, stats_field_counter(math.floor(now / interval), name), n)
    redis.call('HINCRBY', stats, stats_field_total(name), n)
  end
end

local function stat_gap(stats, interval, now, name, gap)
  local index = math.floor(now / interval)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.COUNT), 1)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.SUM), gap)
  local max_field = stats_field_gap(index, name, PART.MAX)
  local max = tonumber(redis.call('HGET', stats, max_field) or '-1')
  if gap > max then
    redis.call('HSET', stats, max_field, gap)
  end
end
