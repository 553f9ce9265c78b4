-- Adds to many fields of one counts hash in one call: the pushers' figures (live/push_counts.py), a
-- few fields per topic pushed to, which as one command each would hold a pusher's loop for long.
-- KEYS[1] pushes
-- ARGV[1...] per field: field, increment
-- Returns how many fields it added to.
for i = 1, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return #ARGV / 2
