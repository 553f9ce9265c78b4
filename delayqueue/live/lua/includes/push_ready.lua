-- Pushes an id onto the ready list (FIFO: LPUSH here, RPOP in pull) and wakes long pollers when
-- the list goes from empty to non-empty; a woken poller passes the wake on while messages
-- remain, so one publish per empty->non-empty edge is enough.
-- push_ready(ready key, ready channel, topic, id)
local function push_ready(ready, channel, topic, id)
  if redis.call('LPUSH', ready, id) == 1 then
    redis.call('PUBLISH', channel, topic)
  end
end
