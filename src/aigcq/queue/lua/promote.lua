-- Move delayed tasks whose back-off is over to the head of their wait queue. Returns how
-- many left the delayed set.
--! move promote
--! arg now
--! arg limit   how many at most
local ids = redis.call('ZRANGEBYSCORE', P .. ':delayed', '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('ZREM', P .. ':delayed', id)
  local h = redis.call('HMGET', tkey(id), 'status', 'AIGC', 'platform')
  if allowed(FROM.promote, h[1]) then redis.call('LPUSH', waitkey(h[2], h[3]), id) end
end
if #ids > 0 then redis.call('PUBLISH', P .. ':events', 'wake') end
return #ids
