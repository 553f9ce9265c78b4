-- Takes up to `batch` ready messages, the highest priority first and the oldest first within a
-- priority, and puts them in flight with an ack deadline. Messages due by now are made ready first
-- (as the scanner's promote_due does), so a pull made at a message's due time gets it. A message found past its TTL or out of
-- deliveries is ended instead of returned. With a consume rate, each message handed out takes a
-- token from the topic's bucket: a pull hands out at most the whole tokens there are, and none at
-- all answers how long until there is one. A paused topic (its meta hash's 'paused',
-- stores/topic_settings.py, or the caller's settings while the meta has none: Redis lost it) hands out nothing,
-- as does one whose meta's 'push_url' or 'push_secret_id' is not the caller's (a URL changed, push turned on or
-- off, a new signing secret, since the caller read its settings).
-- KEYS[1] ready
-- KEYS[2] inflight
-- KEYS[3] msgs
-- KEYS[4] expiry
-- KEYS[5] ended
-- KEYS[6] stats
-- KEYS[7] meta
-- KEYS[8] events
-- KEYS[9] buckets
-- KEYS[10] prioritised
-- KEYS[11] waiting
-- ARGV[1] batch: most messages returned
-- ARGV[2] ack_timeout_millis
-- ARGV[3] retention_millis: how long an ended body stays readable
-- ARGV[4] stats_interval_millis
-- ARGV[5] schedule_channel: published when the ack deadline, or the TTL of a message this pull made
-- ready, is earlier than the scanner expects
-- ARGV[6] topic
-- ARGV[7] actor: 'process@host' for the history, '' with the message log off
-- ARGV[8] consume_rate: messages a second, 0 for no limit
-- ARGV[9] scan_limit: most due messages made ready first (DELAYQUEUE_SCANNER_BATCH)
-- ARGV[10] ready_channel: published when messages this pull made ready are left for others
-- ARGV[11] max_inflight: 0 for none; else the pull hands out at most what keeps the topic's in-flight
--   messages at or under it (a push topic's pushConcurrency, counted across every pusher)
-- ARGV[12] paused: 1 when the caller's topic settings say paused, which holds while the meta has no
--   'paused' (the mirror went with a Redis that lost its data): a pusher's pull asks no other copy
-- ARGV[13] push_url: '' for a consumer's pull; else the URL the pusher pulling POSTs to
-- ARGV[14] push_secret_id: '' for a consumer's pull; else which signing secret the pusher pulling signs with
-- Returns {messages left ready (every priority), 0, µs until the next waiting message is due (-1:
-- none; 0 when the pull handed out messages: not looked at), Redis' clock (epoch µs), msgId1, stored1,
-- msgId2, stored2, ... (each message as includes/stored.lua stores it)
-- ...}, or {messages in ready, ms until a token} when the consume rate allows none now, or
-- {messages in ready, -1} when the topic is paused, or not the caller's to take.
-- @include clock
-- @include token_bucket
-- @include stats
-- @include status
-- @include end_message
-- @include next_due
-- @include ready_queue
-- @include promote
-- @include fold
-- @include stored
-- @include chunked
local t = {msgs = KEYS[3], expiry = KEYS[4], ended = KEYS[5], events = KEYS[8], actor = ARGV[7],
           retention = tonumber(ARGV[3]), ready = KEYS[1], prioritised = KEYS[10], waiting = KEYS[11]}
local inflight, stats, meta, buckets = KEYS[2], KEYS[6], KEYS[7], KEYS[9]
local batch = tonumber(ARGV[1])
local interval = tonumber(ARGV[4])
local rate = tonumber(ARGV[8])
local now, now_us = clock()
local mirror = redis.call('HMGET', meta, META.PAUSED, META.PUSH_URL, META.PUSH_SECRET_ID)
local paused, push_url, secret_id = mirror[1], mirror[2], mirror[3]
if paused == '1' or (not paused and ARGV[12] == '1') or (push_url and push_url ~= ARGV[13])
    or (secret_id and secret_id ~= ARGV[14]) then
  return {ready_count(t), -1}
end
local tokens
if rate > 0 then
  tokens = bucket_level(buckets, BUCKET.CONSUME, rate, now_us)
  if tokens < 1 then
    return {ready_count(t), bucket_wait(tokens, 1, rate)}
  end
  batch = math.min(batch, math.floor(tokens))
end
local max_inflight = tonumber(ARGV[11])
if max_inflight > 0 then
  batch = math.min(batch, max_inflight - redis.call('ZCARD', inflight))
end
-- No channel: this pull takes what it made ready; only what it leaves is published, below.
local _, promoted, earliest, promoted_ended, lateness = promote(t, now, tonumber(ARGV[9]), nil)
fold_fields(stats, promotion_fields(interval, now, promoted, promoted_ended, lateness))
-- Whether a message it made ready now has the topic's earliest TTL (the scanner may sleep past it).
local sooner_ttl = earliest and next_due(t.expiry, now_us) >= earliest * 1000 - now_us
local deadline = now + tonumber(ARGV[2])
local earliest_deadline = next_due(inflight, now_us)

redis.call('HSET', meta, META.LAST_ACTIVE, now)
local out = {0, 0, 0, now_us}
local ended_count = 0
local pulled_changes, gaps, stores, deadlines, handed = {}, {}, {}, {}, {}
-- Bounded so that a list of stale ids cannot hold the script for long.
local budget = batch + 1000
local pulled = 0
while pulled < batch and budget > 0 do
  local ids = pop_ready(t, math.min(batch - pulled, budget))
  if #ids == 0 then
    break
  end
  budget = budget - #ids
  local raws = hmget_chunked(t.msgs, ids)
  for j, id in ipairs(ids) do
    if raws[j] and not handed[id] then
      handed[id] = true
      local m = decode_stored(raws[j], id)
      if is_live(m) then
        if m.expireTime <= now or m.retry > m.maxRetry then
          end_message(t, id, m, now, end_reason(m, now))
          ended_count = ended_count + 1
        else
          m.status = STATUS.CONSUMING
          m.retry = m.retry + 1
          local encoded = encode_stored(m)
          stores[#stores + 1], stores[#stores + 2] = id, encoded
          deadlines[#deadlines + 1], deadlines[#deadlines + 2] = deadline, id
          add_change(pulled_changes, id, m)
          out[#out + 1], out[#out + 2] = id, encoded
          pulled = pulled + 1
          gap_add(gaps, now - m.triggerTime)
        end
      end
    end
  end
end
call_chunked('HSET', t.msgs, stores)
call_chunked('ZADD', inflight, deadlines)

log_events(t.events, t.actor, pulled_changes, STATUS.READY, REASON.PULLED)
stat_gaps(stats, interval, now, GAP.PULL, gaps)
if rate > 0 then
  bucket_store(buckets, BUCKET.CONSUME, tokens - pulled, now_us)
end
stat_add(stats, interval, now, COUNTER.PULL, pulled)
stat_add(stats, interval, now, COUNTER.END_LIFE, ended_count)
-- The scanner is woken for an ack deadline, or a TTL of the promoted, earlier than it expects.
if (pulled > 0 and (earliest_deadline < 0 or (deadline - now) * 1000 < earliest_deadline)) or sooner_ttl then
  redis.call('PUBLISH', ARGV[5], ARGV[6])
end
out[1] = ready_count(t)
if promoted > 0 and out[1] > 0 then
  redis.call('PUBLISH', ARGV[10], t.ready)
end
if pulled == 0 then  -- only a long poll that got nothing waits for the next due time
  out[3] = next_due(t.waiting, now_us)
end
return out
