-- Monitor counters, one hash per topic with a field per interval and counter, so every process
-- adds to the same figures and the previous interval can be read back whole; a lifetime total
-- beside them for Prometheus counters. Field names: live/stats.py (the prelude's stats_field_*).
-- stat_add(stats key, interval ms, now ms, COUNTER name, amount)
-- stat_gap(stats key, interval ms, now ms, GAP name, gap ms): count, sum and max of the interval
-- stat_gaps(stats key, interval ms, now ms, GAP name, count, sum ms, max ms): many gaps at once
--   (a script that moves many messages writes their gaps once, not per message)
local function stat_add(stats, interval, now, name, n)
  if n ~= 0 then
    redis.call('HINCRBY', stats, stats_field_counter(math.floor(now / interval), name), n)
    redis.call('HINCRBY', stats, stats_field_total(name), n)
  end
end

local function stat_gaps(stats, interval, now, name, count, sum, max_gap)
  if count == 0 then
    return
  end
  local index = math.floor(now / interval)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.COUNT), count)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.SUM), sum)
  local max_field = stats_field_gap(index, name, PART.MAX)
  local max = tonumber(redis.call('HGET', stats, max_field) or '-1')
  if max_gap > max then
    redis.call('HSET', stats, max_field, max_gap)
  end
end

local function stat_gap(stats, interval, now, name, gap)
  stat_gaps(stats, interval, now, name, 1, gap, gap)
end
