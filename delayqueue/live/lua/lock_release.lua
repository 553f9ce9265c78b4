-- Releases a scanner's topic lock only if it still holds it (compare-and-delete).
-- KEYS[1] lock
-- ARGV[1] token: the scanner's lock token
-- Returns 1 if released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
