-- A current shard's share of a part of its topic's count of cold messages that a retired shard count
-- hands on (hand_cold.lua), added once: the meta keeps the part's id (handed:<id>) until the
-- scanner has dropped the part where it was (handed_cold.lua), then its mark.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- ARGV[1] part_id: the part's
-- ARGV[2] cold: this shard's share of its count
-- ARGV[3...] per hour: hour, count
-- Returns 1 if it added the share, 0 if it had before.
if redis.call('HSETNX', KEYS[1], META.HANDED .. ':' .. ARGV[1], 1) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], META.COLD, ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
