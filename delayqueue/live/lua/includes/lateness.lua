-- Fire lateness (promotion time - triggerTime, ms), gathered over one script run and written
-- once into the stats hash: a histogram for Prometheus (a field per bucket, not cumulative, plus
-- sum and count) and a per-minute count/sum/max series for the dashboard's chart (pruned after
-- CHART_MINUTES by prune_stats). Field names: live/stats.py (the prelude's stats_field_*).
-- lateness_add(accumulator table, gap ms)
-- lateness_flush(stats key, now ms, accumulator table)
--   The accumulator is also a gap_add one (its count, sum and max), for stat_gaps.
-- @include stats
local function lateness_add(acc, gap)
  local bucket = LATENESS_OVERFLOW
  for _, bound in ipairs(LATENESS_BOUNDS) do
    if gap <= bound then
      bucket = bound
      break
    end
  end
  acc[bucket] = (acc[bucket] or 0) + 1
  gap_add(acc, gap)
end

local function lateness_flush(stats, now, acc)
  if not acc.count then
    return
  end
  for bucket, n in pairs(acc) do
    if bucket ~= 'count' and bucket ~= 'sum' and bucket ~= 'max' then
      redis.call('HINCRBY', stats, stats_field_lateness_bucket(bucket), n)
    end
  end
  redis.call('HINCRBY', stats, stats_field_lateness(PART.COUNT), acc.count)
  redis.call('HINCRBY', stats, stats_field_lateness(PART.SUM), acc.sum)
  local minute = math.floor(now / 60000)
  redis.call('HINCRBY', stats, stats_field_minute_lateness(minute, PART.COUNT), acc.count)
  redis.call('HINCRBY', stats, stats_field_minute_lateness(minute, PART.SUM), acc.sum)
  local max_field = stats_field_minute_lateness(minute, PART.MAX)
  local max = tonumber(redis.call('HGET', stats, max_field) or '-1')
  if acc.max > max then
    redis.call('HSET', stats, max_field, acc.max)
  end
end
