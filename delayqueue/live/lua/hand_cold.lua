-- The scanner's hand-over of a retired shard count's parts of its topic's count of cold messages to
-- the current count's shards (workers/scanner.py), in steps a scanner killed between any two leaves
-- for the next turn to finish (the count drains until they are done): this script takes the shard's
-- part (its count and hours) into the meta's handing, receive_cold.lua adds it to each current shard
-- once, under its id, and handed_cold.lua drops it. No reader adds up a retired count's parts.
-- KEYS[1] meta
-- KEYS[2] cold_hours
-- KEYS[3] packed
-- ARGV[1] part_id: the id of the part it takes
-- Returns the part being handed on, {id, count, then hour, count, ...}: one taken before and not yet
-- dropped (under its id), else the shard's own, taken now (under this id); {} when it has none; nil
-- while a packed list is left (counted cold until the scanner moves it in).
local meta, hours = KEYS[1], KEYS[2]
local handing = redis.call('HGET', meta, META.HANDING)
if handing then
  return cjson.decode(handing)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return false
end
local part = redis.call('HGETALL', hours)
local cold = redis.call('HGET', meta, META.COLD) or '0'
if cold == '0' and #part == 0 then
  return {}
end
table.insert(part, 1, cold)
table.insert(part, 1, ARGV[1])
redis.call('HSET', meta, META.HANDING, cjson.encode(part))
redis.call('HDEL', meta, META.COLD)
redis.call('DEL', hours)
return part
