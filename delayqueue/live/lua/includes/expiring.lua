-- Which live messages the expiry index holds: the ready and consuming ones, and a waiting one
-- only when its expireTime comes before its triggerTime (a nack's delay past its TTL). Any other
-- waiting message cannot expire while it waits, so it enters the index when it becomes ready
-- (set_ready), and a hot waiting message costs the index nothing.
-- expires_first(message) -> whether expiry holds it
local function expires_first(m)
  return m.status ~= STATUS.WAITING or m.expireTime < m.triggerTime
end
