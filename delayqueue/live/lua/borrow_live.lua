-- A namespace's pool of live-message room: the part of its live-message cap that no topic
-- holds as its share. Takes up to `wanted` of it for topics (a negative `wanted` gives room
-- back). The pool remembers the cap it was counted for, and a changed cap changes it by the
-- difference, so the shares and the pool never hold more than the cap in all.
-- Room taken is in transit until its taker has added it to its topics' shares and says so
-- (`landed`, with its next call): a caller short of room learns that some may soon be unused
-- in a share, where it can take it back. Transit a killed caller never settles is forgotten
-- once none has been taken for LIVE_ROOM_TRANSIT_MILLIS. The pool also counts the calls that
-- took room, so that a caller can tell whether any did between two of its calls.
-- KEYS[1] live_pool
-- ARGV[1] wanted
-- ARGV[2] max_live: the namespace's cap now
-- ARGV[3] held: the shares its topics hold in all, -1 when the caller has not counted them
-- ARGV[4] landed: room this caller took before that is in its topics' shares now (or comes back with this call)
-- Returns {room granted (0 when giving back), room in transit now (what this call granted
-- included), calls that took room so far}, or {-1, 0, 0} when the pool does not exist yet
-- (first use, or Redis lost its data) and `held` is -1: the caller counts the shares and asks
-- again.
-- @include clock
local pool = KEYS[1]
local wanted, max_live, held, landed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local free = tonumber(redis.call('HGET', pool, 'free') or '')
if not free and (wanted <= 0 or held < 0) then
  -- Without a pool the room is counted afresh when one is made: nothing to give back or land.
  return {wanted <= 0 and 0 or -1, 0, 0}
end
local now = clock()
local transit = tonumber(redis.call('HGET', pool, 'transit') or '0')
local borrows = tonumber(redis.call('HGET', pool, 'borrows') or '0')
if now - tonumber(redis.call('HGET', pool, 'transit_at') or '0') > LIVE_ROOM_TRANSIT_MILLIS then
  transit = 0
end
transit = math.max(transit - landed, 0)
if wanted <= 0 then
  redis.call('HSET', pool, 'free', free - wanted, 'transit', transit)
  return {0, transit, borrows}
end
if not free then
  free = max_live - held
else
  free = free + max_live - tonumber(redis.call('HGET', pool, 'max_live'))
end
local granted = math.max(math.min(wanted, free), 0)
redis.call('HSET', pool, 'free', free - granted, 'max_live', max_live, 'transit', transit + granted)
if granted > 0 then
  borrows = borrows + 1
  redis.call('HSET', pool, 'transit_at', now, 'borrows', borrows)
end
return {granted, transit + granted, borrows}
