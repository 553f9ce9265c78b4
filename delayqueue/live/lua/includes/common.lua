-- Shared helpers, inlined by the loader wherever a script says "-- @include common".
-- Message statuses: 1 waiting, 2 ready, 3 consuming, 4 acked, 5 expired, 6 retries/ttl exhausted, 7 deleted.

-- The topic's lifecycle event stream and who is acting (process@host). A script that changes
-- a message's status sets both from its KEYS/ARGV; ACTOR '' means the message log is off.
local EVENTS, ACTOR = nil, ''

-- Redis server time, read once per script: in ms (the unit of every stored time) and in µs
-- (for how long a scanner should sleep). One clock for every web and scanner process.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- Monitor counters live in one hash per topic, fields "<interval index>:<name>", so every
-- process adds to the same figures and the previous interval can be read back whole.
-- "total:<name>" keeps a lifetime count beside them for Prometheus counters.
local function stat_add(stats_key, interval_ms, now, name, n)
  if n ~= 0 then
    redis.call('HINCRBY', stats_key, math.floor(now / interval_ms) .. ':' .. name, n)
    redis.call('HINCRBY', stats_key, 'total:' .. name, n)
  end
end

local function stat_gap(stats_key, interval_ms, now, name, gap)
  local prefix = math.floor(now / interval_ms) .. ':' .. name
  redis.call('HINCRBY', stats_key, prefix .. ':count', 1)
  redis.call('HINCRBY', stats_key, prefix .. ':sum', gap)
  local max = tonumber(redis.call('HGET', stats_key, prefix .. ':max') or '-1')
  if gap > max then
    redis.call('HSET', stats_key, prefix .. ':max', gap)
  end
end

-- Fire lateness (promotion time - triggerTime, ms), gathered over one script run with
-- lateness_add and written once by lateness_flush into the stats hash: a histogram for
-- Prometheus ("lateness:le:<bound>" per bucket, not cumulative, plus sum and count; the
-- bounds are selectors.LATENESS_BOUNDS_MS) and a per-minute count/sum/max series for the
-- dashboard's chart ("m<minute>:lateness:*", pruned after an hour by prune_stats).
local LATENESS_BOUNDS = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}

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

local function lateness_flush(stats_key, now, acc)
  if not acc.count then
    return
  end
  for bucket, n in pairs(acc) do
    if bucket ~= 'count' and bucket ~= 'sum' and bucket ~= 'max' then
      redis.call('HINCRBY', stats_key, 'lateness:le:' .. bucket, n)
    end
  end
  redis.call('HINCRBY', stats_key, 'lateness:count', acc.count)
  redis.call('HINCRBY', stats_key, 'lateness:sum', acc.sum)
  local minute = 'm' .. math.floor(now / 60000) .. ':lateness:'
  redis.call('HINCRBY', stats_key, minute .. 'count', acc.count)
  redis.call('HINCRBY', stats_key, minute .. 'sum', acc.sum)
  local max = tonumber(redis.call('HGET', stats_key, minute .. 'max') or '-1')
  if acc.max > max then
    redis.call('HSET', stats_key, minute .. 'max', acc.max)
  end
end

local function is_live(m)
  return m.status == 1 or m.status == 2 or m.status == 3
end

-- The log writer reads a stream when told it has entries: one notice as the stream goes from
-- empty to non-empty is enough, since the writer reads on while entries remain. The channel is
-- the stream's key with 'history' for 'events' (keys.TopicKeys.history).
local function notify_writer()
  if redis.call('XLEN', EVENTS) == 1 then
    redis.call('PUBLISH', string.sub(EVENTS, 1, -7) .. 'history', '')
  end
end

-- Records one status change in the topic's event stream, in the same atomic step as the
-- change itself; the scanners' log writer drains the stream into PostgreSQL. The stream
-- entry id (Redis time) is the event's time and its idempotency key; produceTime tells
-- apart two lives of one msgId.
local function log_event(id, m, from, reason)
  if ACTOR ~= '' then
    redis.call('XADD', EVENTS, '*', 'i', id, 'f', from, 't', m.status, 'r', m.retry,
      'p', m.produceTime, 'w', reason, 'a', ACTOR)
    notify_writer()
  end
end

-- Records the same change of many messages (all from one status, for one reason) as one
-- stream entry: field 'b' holds [[id, to status, retry, produceTime], ...]. The writer reads
-- it as one event per message; a restore of thousands of messages then costs Redis one
-- XADD per script call instead of one per message.
local function log_events(changes, from, reason)
  if ACTOR ~= '' and #changes > 0 then
    redis.call('XADD', EVENTS, '*', 'b', cjson.encode(changes), 'f', from, 'w', reason, 'a', ACTOR)
    notify_writer()
  end
end

-- Why a live message with no time or deliveries left ends.
local function end_reason(m, now)
  return (m.expireTime <= now) and 'expired' or 'retries_exhausted'
end

-- Ends a live message: 5 if it was never delivered, 6 otherwise, unless a status is given.
-- The body stays readable (getMsg) until the ended set says to purge it.
local function end_message(msgs_key, expiry_key, ended_key, id, m, now, retention, reason, status)
  local from = m.status
  m.status = status or ((m.retry == 0) and 5 or 6)
  redis.call('HSET', msgs_key, id, cjson.encode(m))
  redis.call('ZREM', expiry_key, id)
  redis.call('ZADD', ended_key, now + retention, id)
  log_event(id, m, from, reason)
  return m.status
end

-- Microseconds until the earliest member of a sorted set (scored in ms) is due, or -1 when it
-- is empty. Measured against the clock in microseconds, so a scanner sleeping this long wakes
-- at the due millisecond rather than up to a millisecond after it.
local function next_due(zset_key, now_us)
  local first = redis.call('ZRANGE', zset_key, 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return -1
  end
  local delta = tonumber(first[2]) * 1000 - now_us
  if delta < 0 then
    return 0
  end
  return delta
end

-- Pushes ids onto the ready list (FIFO: LPUSH here, RPOP in pull) and wakes long pollers
-- when the list goes from empty to non-empty; a woken poller passes the wake on while
-- messages remain, so one publish per empty->non-empty edge is enough.
local function push_ready(ready_key, channel, topic, id)
  if redis.call('LPUSH', ready_key, id) == 1 then
    redis.call('PUBLISH', channel, topic)
  end
end
