-- Whether a msgId the message log holds waiting after the topic's loaded_to is cold, for the API's
-- paths (services/messages.py) before they read or change its log row: Redis does not hold it,
-- and the row is the loader's to bring in (includes/packed.lua's cold_row). Else Redis ended it
-- before the log writer caught up, and Redis answers for it.
-- KEYS[1] msgs
-- KEYS[2] meta
-- KEYS[3] packed
-- ARGV[1] msg_id
-- ARGV[2] trigger_time: the log row's, ms
-- Returns 1 if cold, else 0.
-- @include packed
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[1], id) == 1 then
  return 0
end
return cold_row({meta = KEYS[2], packed = KEYS[3]}, id, tonumber(ARGV[2])) and 1 or 0
