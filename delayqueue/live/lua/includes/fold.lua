-- Adds figures gathered elsewhere into a stats or counts hash, in one call: each field added, but
-- a max part, which keeps the greater (the rule live/stats.added reads a sharded topic's shards by).
-- fold_fields(key, {field, value, ...}) -> how many fields it folded in
local function fold_fields(key, fields)
  local max_suffix = ':' .. PART.MAX
  for i = 1, #fields, 2 do
    local name, value = fields[i], tonumber(fields[i + 1])
    if string.sub(name, -#max_suffix) == max_suffix then
      if value > tonumber(redis.call('HGET', key, name) or '-1') then
        redis.call('HSET', key, name, value)
      end
    else
      redis.call('HINCRBY', key, name, value)
    end
  end
  return #fields / 2
end
