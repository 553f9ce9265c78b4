-- A retired shard count's monitor counters, added into the topic's first current shard's (the
-- scanner's retirement, workers/scanner.py): each field added, but a max part, which keeps the
-- greater (the rule live/stats.added reads a sharded topic's shards by).
-- KEYS[1] stats
-- ARGV[1...] per field: field, value
-- Returns how many fields it folded in.
local max_suffix = ':' .. PART.MAX
for i = 1, #ARGV, 2 do
  local name, value = ARGV[i], tonumber(ARGV[i + 1])
  if string.sub(name, -#max_suffix) == max_suffix then
    if value > tonumber(redis.call('HGET', KEYS[1], name) or '-1') then
      redis.call('HSET', KEYS[1], name, value)
    end
  else
    redis.call('HINCRBY', KEYS[1], name, value)
  end
end
return #ARGV / 2
