-- Extends a scanner's topic lock only if it still holds it (compare-and-pexpire).
-- KEYS[1] lock
-- ARGV[1] token: the scanner's lock token
-- ARGV[2] ttl_millis
-- Returns 1 if renewed, 0 if the lock is gone or held by another scanner.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
