-- Deletes a live message: status deleted and out of every queue structure at once; with release
-- the body goes too. A missing, ended or expired message is not deleted (returns 0), but
-- release still frees an ended body.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] stats
-- KEYS[8] events
-- KEYS[9] prioritised
-- KEYS[10] meta
-- KEYS[11] cold_hours
-- KEYS[12] packed
-- KEYS[13] released
-- ARGV[1] msg_id
-- ARGV[2] release: 1 frees the body at once, 0 keeps it readable for the retention
-- ARGV[3] retention_millis: how long an ended body stays readable
-- ARGV[4] stats_interval_millis
-- ARGV[5] actor: 'process@host' for the history, '' with the message log off
-- ARGV[6] tombstone: '' or, for a message the caller has deleted in the message log (cold, or live
-- there after Redis lost it), its stored record as deleted, without its body (getMsg reads that
-- from the log: services/messages.tombstone): kept readable as an ended message if Redis does not
-- hold the msgId (so a loader or a restore that read the row before the delete does not
-- bring it in; with release, only its life in released does that), else it is deleted here
-- ARGV[7] release_ended: 1 only frees the body, and only if the message has ended (the end of a
-- release that answered 3: a life sent since stays)
-- ARGV[8] counted_cold: 1 when the tombstone's message was cold (counted in the meta's cold), 0 when
-- it was a live row Redis lost (never counted cold)
-- ARGV[9] signed: 1 for a shard of a sharded topic (the count it is out of: includes/cold_count.lua's signed_part)
-- Returns 1 when a live message was deleted, 0 when it had ended (or the tombstone's life was
-- released), -1 when Redis does not hold the msgId, 2 when the tombstone (with release: its life's
-- mark) was kept, 3 when a live message due at or after the meta's loaded_to was deleted with
-- release: its log row, waiting until the log writer catches up, would read as a cold message's, so
-- its body is kept, as deleted, until the caller has ended the row there (then release_ended frees it).
-- @include clock
-- @include status
-- @include end_message
-- @include cold_count
-- @include packed
-- @include stored
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], msgs = KEYS[4], expiry = KEYS[5],
           ended = KEYS[6], stats = KEYS[7], events = KEYS[8], prioritised = KEYS[9],
           actor = ARGV[5], retention = tonumber(ARGV[3])}
local id = ARGV[1]
local interval = tonumber(ARGV[4])
local now = clock()

-- Frees the body of the life produced then. Nothing else of it stays: a restore or a loader that
-- read its log row before the end was recorded there (still live) would bring it back, but for its
-- tombstone in released.
local function release_body(produced)
  redis.call('HDEL', t.msgs, id)
  redis.call('ZREM', t.ended, id)
  local released = KEYS[13]
  redis.call('ZREMRANGEBYSCORE', released, '-inf', now)
  redis.call('ZADD', released, now + t.retention, id .. ':' .. produced)
  redis.call('PEXPIRE', released, t.retention)
end

local raw = redis.call('HGET', t.msgs, id)
if not raw then
  if ARGV[6] == '' then
    return -1
  end
  local tombstone = decode_stored(ARGV[6], id)
  if redis.call('ZSCORE', KEYS[13], id .. ':' .. tombstone.produceTime) then
    return 0  -- a life deleted with its body released: ended, though its log row may read live yet
  end
  if ARGV[2] == '1' then
    release_body(tombstone.produceTime)  -- its body never comes into Redis: the mark fences the life alone
  else
    redis.call('HSET', t.msgs, id, ARGV[6])
    redis.call('ZADD', t.ended, now + t.retention, id)
  end
  local trigger = tombstone.triggerTime
  if ARGV[8] == '1' then
    if ARGV[9] == '1' then
      signed_part(KEYS[10])
    end
    remove_packed({packed = KEYS[12], meta = KEYS[10]}, id, trigger)  -- if the loader had read it ahead
    cold_moved(KEYS[10], KEYS[11], hours_of({trigger}))
  end
  stat_add(t.stats, interval, now, COUNTER.DELETE, 1)
  return 2
end
local m = decode_stored(raw, id)

if ARGV[7] == '1' then
  if not is_live(m) then
    release_body(m.produceTime)
  end
  return 0
end
local deleted = 0
if is_live(m) then
  if m.expireTime <= now then
    end_expired(t, id, m, now, interval)
  else
    remove_from_queues(t, id, m)
    end_message(t, id, m, now, REASON.DELETED, STATUS.DELETED)
    stat_add(t.stats, interval, now, COUNTER.DELETE, 1)
    deleted = 1
  end
end
if ARGV[2] == '1' then
  local loaded_to = tonumber(string.match(redis.call('HGET', KEYS[10], META.LOADED_TO) or '', '^[^:]*'))
  if deleted == 1 and loaded_to and m.triggerTime >= loaded_to then
    return 3
  end
  release_body(m.produceTime)
end
return deleted
