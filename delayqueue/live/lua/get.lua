-- Reads one message. A live message already past its TTL is ended first (expired or
-- exhausted), so a reader never sees a live status the scanner simply has not reached yet.
-- KEYS[1] waiting
-- KEYS[2] ready
-- KEYS[3] inflight
-- KEYS[4] msgs
-- KEYS[5] expiry
-- KEYS[6] ended
-- KEYS[7] stats
-- KEYS[8] events
-- KEYS[9] prioritised
-- ARGV[1] msg_id
-- ARGV[2] retention_millis: how long an ended body stays readable
-- ARGV[3] stats_interval_millis
-- ARGV[4] actor: 'process@host' for the history, '' with the message log off
-- Returns the message json, or nil.
-- @include clock
-- @include status
-- @include end_message
-- @include stored
local t = {waiting = KEYS[1], ready = KEYS[2], inflight = KEYS[3], msgs = KEYS[4], expiry = KEYS[5],
           ended = KEYS[6], stats = KEYS[7], events = KEYS[8], prioritised = KEYS[9],
           actor = ARGV[4], retention = tonumber(ARGV[2])}
local interval = tonumber(ARGV[3])
local now = clock()
local raw = redis.call('HGET', t.msgs, ARGV[1])
if not raw then
  return nil
end
local m = decode_stored(raw, ARGV[1])
if is_live(m) and m.expireTime <= now then
  end_expired(t, ARGV[1], m, now, interval)
  raw = encode_stored(m)
end
stat_add(t.stats, interval, now, COUNTER.GET, 1)
return wire_json(raw, ARGV[1])
