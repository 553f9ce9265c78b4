-- Monitor counters, one hash per topic with fields "<interval index>:<name>", so every process
-- adds to the same figures and the previous interval can be read back whole; "total:<name>"
-- keeps a lifetime count beside them for Prometheus counters.
-- stat_add(stats key, interval ms, now ms, counter name, amount)
-- stat_gap(stats key, interval ms, now ms, gap name, gap ms): count, sum and max of the interval
local function stat_add(stats, interval, now, name, n)
  if n ~= 0 then
    redis.call('HINCRBY', stats, math.floor(now / interval) .. ':' .. name, n)
    redis.call('HINCRBY', stats, 'total:' .. name, n)
  end
end

local function stat_gap(stats, interval, now, name, gap)
  local prefix = math.floor(now / interval) .. ':' .. name
  redis.call('HINCRBY', stats, prefix .. ':count', 1)
  redis.call('HINCRBY', stats, prefix .. ':sum', gap)
  local max = tonumber(redis.call('HGET', stats, prefix .. ':max') or '-1')
  if gap > max then
    redis.call('HSET', stats, prefix .. ':max', gap)
  end
end
