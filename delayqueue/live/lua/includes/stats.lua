-- Monitor counters, one hash per topic with a field per interval and counter, so every process
-- adds to the same figures and the previous interval can be read back whole; a lifetime total
-- beside them for Prometheus counters. Field names: live/stats.py (the prelude's stats_field_*).
-- A script writes what it counts at once, or answers it as fields for another call to write
-- (promote_due.lua: the scanner writes a second of them at once).
-- counter_fields(fields, interval ms, now ms, COUNTER name, amount) -> fields, with the interval's
--   field and the total of the counter and what to add to each (none for 0): {field, value, ...}
-- gap_add(accumulator, gap ms): one more gap into a table ({} at first) of their count, sum and max
-- gap_fields(fields, interval ms, now ms, GAP name, accumulator) -> fields, with the interval's
--   count, sum and max of the gaps a script gathered (none for none)
-- stat_add(stats key, interval ms, now ms, COUNTER name, amount): counter_fields, written
-- stat_gaps(stats key, interval ms, now ms, GAP name, accumulator): gap_fields, written
-- field_add(fields, field, value): one more pair
-- gap_parts(fields, accumulator, field_of(PART) -> field): its count, sum and max, as the fields named
-- @include fold
local function field_add(fields, name, value)
  fields[#fields + 1], fields[#fields + 2] = name, value
end

local function gap_parts(fields, acc, field_of)
  for part, value in pairs({[PART.COUNT] = acc.count, [PART.SUM] = acc.sum, [PART.MAX] = acc.max}) do
    field_add(fields, field_of(part), value)
  end
end

local function counter_fields(fields, interval, now, name, n)
  if n ~= 0 then
    field_add(fields, stats_field_counter(math.floor(now / interval), name), n)
    field_add(fields, stats_field_total(name), n)
  end
  return fields
end

local function gap_add(acc, gap)
  acc.count = (acc.count or 0) + 1
  acc.sum = (acc.sum or 0) + gap
  acc.max = math.max(acc.max or gap, gap)
end

local function gap_fields(fields, interval, now, name, acc)
  if acc.count then
    local index = math.floor(now / interval)
    gap_parts(fields, acc, function(part) return stats_field_gap(index, name, part) end)
  end
  return fields
end

local function stat_add(stats, interval, now, name, n)
  fold_fields(stats, counter_fields({}, interval, now, name, n))
end

local function stat_gaps(stats, interval, now, name, acc)
  fold_fields(stats, gap_fields({}, interval, now, name, acc))
end
