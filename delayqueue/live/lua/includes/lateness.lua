-- Fire lateness (promotion time - triggerTime, ms), gathered over one script run and written
-- once into the stats hash: a histogram for Prometheus ("lateness:le:<bound>" per bucket, not
-- cumulative, plus sum and count) and a per-minute count/sum/max series for the dashboard's
-- chart ("m<minute>:lateness:*", pruned after CHART_MINUTES by prune_stats).
-- lateness_add(accumulator table, gap ms)
-- lateness_flush(stats key, now ms, accumulator table)
local function lateness_add(acc, gap)
  local bucket = 'inf'
  for _, bound in ipairs(LATENESS_BOUNDS) do
    if gap <= bound then
      bucket = bound
      break
    end
  end
  acc[bucket] = (acc[bucket] or 0) + 1
  acc.count = (acc.count or 0) + 1
  acc.sum = (acc.sum or 0) + gap
  acc.max = math.max(acc.max or 0, gap)
end

local function lateness_flush(stats, now, acc)
  if not acc.count then
    return
  end
  for bucket, n in pairs(acc) do
    if bucket ~= 'count' and bucket ~= 'sum' and bucket ~= 'max' then
      redis.call('HINCRBY', stats, 'lateness:le:' .. bucket, n)
    end
  end
  redis.call('HINCRBY', stats, 'lateness:count', acc.count)
  redis.call('HINCRBY', stats, 'lateness:sum', acc.sum)
  local minute = 'm' .. math.floor(now / 60000) .. ':lateness:'
  redis.call('HINCRBY', stats, minute .. 'count', acc.count)
  redis.call('HINCRBY', stats, minute .. 'sum', acc.sum)
  local max = tonumber(redis.call('HGET', stats, minute .. 'max') or '-1')
  if acc.max > max then
    redis.call('HSET', stats, minute .. 'max', acc.max)
  end
end
