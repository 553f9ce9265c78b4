-- Variadic commands over as many arguments as a call brings (a batch of a thousand, or more where a
-- setting allows), a few thousand at a time: unpack() takes no more. One command per chunk, not one
-- per message, is what makes a batch cheap.
-- call_chunked(command, key, args[, flag]) -> the sum of the replies (HSET/ZADD pairs: CHUNK is even);
-- flag (ZADD's 'NX') goes before each chunk's arguments
-- hmget_chunked(key, fields) -> the values in order, false for a missing field
local CHUNK = 2000

local function call_chunked(command, key, args, flag)
  local total = 0
  for first = 1, #args, CHUNK do
    local last = math.min(first + CHUNK - 1, #args)
    if flag then
      total = total + redis.call(command, key, flag, unpack(args, first, last))
    else
      total = total + redis.call(command, key, unpack(args, first, last))
    end
  end
  return total
end

local function hmget_chunked(key, fields)
  local values = {}
  for first = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, first, math.min(first + CHUNK - 1, #fields)))
    for j = 1, #part do
      values[first + j - 1] = part[j]
    end
  end
  return values
end
