-- Marks a topic's first send (send.lua: 'registered' is 0) as followed by its registration
-- (register_topics.lua). Until then every send to the topic answers newTopic, so a registration
-- that failed is made by the next send. A topic retired meanwhile (no 'registered') stays so.
-- KEYS[1] meta
-- Returns 1 when marked, 0 when there was nothing to mark.
if redis.call('HGET', KEYS[1], META.REGISTERED) ~= '0' then
  return 0
end
redis.call('HSET', KEYS[1], META.REGISTERED, 1)
return 1
