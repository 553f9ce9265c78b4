-- is_live(message): waiting, ready or consuming
local function is_live(m)
  return m.status == STATUS.WAITING or m.status == STATUS.READY or m.status == STATUS.CONSUMING
end
