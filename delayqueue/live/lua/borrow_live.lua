-- A namespace's pool of live-message room: the part of its live-message cap that no topic
-- holds as its share. Takes up to `wanted` of it for topics (a negative `wanted` gives room
-- back). The pool remembers the cap it was counted for, and a changed cap changes it by the
-- difference, so the shares and the pool never hold more than the cap in all.
-- KEYS[1] live_pool
-- ARGV[1] wanted
-- ARGV[2] max_live: the namespace's cap now
-- ARGV[3] held: the shares its topics hold in all, -1 when the caller has not counted them
-- Returns the room granted (0 when giving back), or -1 when the pool does not exist yet (first
-- use, or Redis lost its data) and `held` is -1: the caller counts the shares and asks again.
local pool = KEYS[1]
local wanted, max_live, held = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local free = tonumber(redis.call('HGET', pool, 'free') or '')
if wanted < 0 then
  if free then  -- without a pool the room is counted afresh when one is made
    redis.call('HINCRBY', pool, 'free', -wanted)
  end
  return 0
end
if not free then
  if held < 0 then
    return -1
  end
  free = max_live - held
else
  free = free + max_live - tonumber(redis.call('HGET', pool, 'max_live'))
end
local granted = math.max(math.min(wanted, free), 0)
redis.call('HSET', pool, 'free', free - granted, 'max_live', max_live)
return granted
