-- Takes a topic's lock from a scanner seen gone (its heartbeat key expired), compare-and-set:
-- only while the lock still names that scanner, or nobody (released, or run out meanwhile).
-- KEYS[1] lock
-- ARGV[1] gone_token: the lock token of the scanner seen gone
-- ARGV[2] token: this scanner's lock token
-- ARGV[3] ttl_millis
-- Returns 1 if taken, 0 if another scanner holds it.
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
