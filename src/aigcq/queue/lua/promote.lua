-- Move delayed tasks whose back-off is over to the head of their wait queue.
-- ARGV: prefix, now, limit
local ids = redis.call('ZRANGEBYSCORE', P .. ':delayed', '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZREM', P .. ':delayed', id)
  local h = redis.call('HMGET', tkey(id), 'status', 'AIGC', 'platform')
  if h[1] == 'pending' then redis.call('LPUSH', waitkey(h[2], h[3]), id) end
end
if #ids > 0 then redis.call('PUBLISH', P .. ':events', 'wake') end
return #ids
