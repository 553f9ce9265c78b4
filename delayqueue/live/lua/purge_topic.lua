-- purgeTopic, one bounded batch: up to `limit` live messages of the topic end as deleted
-- (status 7, history reason 'purged'), the ready ones first (popped from the list's tail and the
-- prioritised set's head, not searched for), then waiting, then consuming ones. The caller
-- repeats it while more remain, so a large topic never holds Redis for long. Counted as deletes
-- (deleteMsg) in the monitor counters, so getMonitorData and /metrics see them as delete.lua's.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] events
-- KEYS[8] stats
-- KEYS[9] prioritised
-- ARGV[1] scan_limit: most messages ended per call (DELAYQUEUE_SCANNER_BATCH)
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] actor: 'process@host' for the history, '' with the message log off
-- ARGV[4] stats_interval_millis
-- Returns {messages purged, 1 if live messages remain else 0}
-- @include clock
-- @include history
-- @include stats
-- @include ready_queue
-- @include stored
local waiting, ready, inflight, msgs, expiry, ended, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  KEYS[7]
local prioritised = KEYS[9]
local limit, retention, actor = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local now = clock()
local purged = 0

-- Ends each id whose stored message has status `from` (ids left behind by an earlier change are skipped).
local function purge(ids, from)
  local changes = {}
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', msgs, id)
    if raw then
      local m = decode_stored(raw, id)
      if m.status == from then
        m.status = STATUS.DELETED
        redis.call('HSET', msgs, id, encode_stored(m))
        redis.call('ZREM', expiry, id)
        redis.call('ZADD', ended, now + retention, id)
        changes[#changes + 1] = {id, STATUS.DELETED, m.retry, m.produceTime}
      end
    end
  end
  log_events(events, actor, changes, from, REASON.PURGED)
  purged = purged + #changes
end

local ready_ids = {}
local top = redis.call('ZPOPMIN', prioritised, limit)
for i = 1, #top, 2 do
  ready_ids[#ready_ids + 1] = top[i]
end
if #ready_ids < limit then
  for _, id in ipairs(redis.call('RPOP', ready, limit - #ready_ids) or {}) do
    ready_ids[#ready_ids + 1] = id
  end
end
local taken = #ready_ids
if taken > 0 then
  purge(ready_ids, STATUS.READY)
end
for _, queue in ipairs({{waiting, STATUS.WAITING}, {inflight, STATUS.CONSUMING}}) do
  if taken < limit then
    local ids = redis.call('ZRANGE', queue[1], 0, limit - taken - 1)
    if #ids > 0 then
      redis.call('ZREMRANGEBYRANK', queue[1], 0, #ids - 1)
      purge(ids, queue[2])
      taken = taken + #ids
    end
  end
end
stat_add(KEYS[8], tonumber(ARGV[4]), now, COUNTER.DELETE, purged)
local more = ready_count({ready = ready, prioritised = prioritised}) + redis.call('ZCARD', waiting)
  + redis.call('ZCARD', inflight) > 0
return {purged, more and 1 or 0}
