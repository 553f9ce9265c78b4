-- Redis server time, read once per script: in ms (the unit of every stored time) and in µs (for
-- how long a scanner should sleep). One clock for every web and scanner process.
-- Returns now_ms, now_us
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end
