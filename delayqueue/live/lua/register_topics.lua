-- Puts topics in their namespace's registry, where the scanners find them and admission finds
-- the room their shares of the namespace's live-message cap hold. A listed topic keeps its time.
-- KEYS[1] topics
-- ARGV[1] at: epoch ms, their registration time
-- ARGV[2...] per topic: name
-- Returns how many were not listed before.
-- @include chunked
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = ARGV[1]
  args[#args + 1] = ARGV[i]
end
-- A restore registers a page's topics at once, thousands: unpack() takes a few thousand values at most.
return call_chunked('ZADD', KEYS[1], args, 'NX')
