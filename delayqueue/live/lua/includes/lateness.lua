-- Fire lateness (promotion time - triggerTime, ms), gathered over one script run: a histogram
-- for Prometheus (a field per bucket, not cumulative, plus sum and count), a per-minute
-- count/sum/max series for the dashboard's chart (pruned after CHART_MINUTES by prune_stats) and
-- the interval's readyGap. Field names: live/stats.py (the prelude's stats_field_*).
-- lateness_add(accumulator table, gap ms): the accumulator is also a gap_add one (count, sum, max)
-- promotion_fields(interval ms, now ms, moved, ended, accumulator) -> what a promotion call
--   counts, as {field, value, ...} for fold_fields (a max part keeps the greater): the scanner
--   folds those of many calls into the stats hash at once (workers/scanner.py), a pull its own
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

local function promotion_fields(interval, now, moved, ended, acc)
  local fields = counter_fields({}, interval, now, COUNTER.READY, moved)
  counter_fields(fields, interval, now, COUNTER.END_LIFE, ended)
  gap_fields(fields, interval, now, GAP.READY, acc)  -- the same gaps: promotion lateness
  if not acc.count then
    return fields
  end
  for bucket, n in pairs(acc) do
    if bucket ~= 'count' and bucket ~= 'sum' and bucket ~= 'max' then
      field_add(fields, stats_field_lateness_bucket(bucket), n)
    end
  end
  field_add(fields, stats_field_lateness(PART.COUNT), acc.count)
  field_add(fields, stats_field_lateness(PART.SUM), acc.sum)
  local minute = math.floor(now / 60000)
  gap_parts(fields, acc, function(part) return stats_field_minute_lateness(minute, part) end)
  return fields
end
