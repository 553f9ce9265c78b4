-- Monitor counters, one hash per topic with a field per interval and counter, so every process
-- adds to the same figures and the previous interval can be read back whole; a lifetime total
-- beside them for Prometheus counters. Field names: live/stats.py (the prelude's stats_field_*).
-- stat_add(stats key, interval ms, now ms, COUNTER name, amount)
-- gap_add(accumulator, gap ms): one more gap into a table ({} at first) of their count, sum and max
-- stat_gaps(stats key, interval ms, now ms, GAP name, accumulator): adds the gaps a script gathered
--   to the interval's count, sum and max, once for all of them
local function stat_add(stats, interval, now, name, n)
  if n ~= 0 then
    redis.call('HINCRBY', stats, stats_field_counter(math.floor(now / interval), name), n)
    redis.call('HINCRBY', stats, stats_field_total(name), n)
  end
end

local function gap_add(acc, gap)
  acc.count = (acc.count or 0) + 1
  acc.sum = (acc.sum or 0) + gap
  acc.max = math.max(acc.max or gap, gap)
end

local function stat_gaps(stats, interval, now, name, acc)
  if not acc.count then
    return
  end
  local index = math.floor(now / interval)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.COUNT), acc.count)
  redis.call('HINCRBY', stats, stats_field_gap(index, name, PART.SUM), acc.sum)
  local max_field = stats_field_gap(index, name, PART.MAX)
  local max = tonumber(redis.call('HGET', stats, max_field) or '-1')
  if acc.max > max then
    redis.call('HSET', stats, max_field, acc.max)
  end
end
