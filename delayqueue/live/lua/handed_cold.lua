-- Drops a part of its topic's count of cold messages that a retired shard count's shard handed on,
-- once every current shard received its share (hand_cold.lua, receive_cold.lua).
-- KEYS[1] meta
-- ARGV[1] part_id: the part's
-- Returns 1 if it dropped it, 0 if the shard hands on no part of that id (another scanner dropped it).
local handing = redis.call('HGET', KEYS[1], META.HANDING)
if handing and cjson.decode(handing)[1] == ARGV[1] then
  redis.call('HDEL', KEYS[1], META.HANDING)
  return 1
end
return 0
