-- Move delayed tasks whose back-off is over back to their wait queue (at their rank); with ``only``,
-- that one task, due or not, and no ``wake`` is published (its caller dispatches it).
-- Returns how many left the delayed set.
--! move promote
--! arg now
--! arg limit   how many at most
--! arg only    a task id ('' = every due one)
local ids = {only}
if only == '' then
  ids = redis.call('ZRANGEBYSCORE', P .. ':delayed', '-inf', now, 'LIMIT', 0, limit)
end
local moved = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', P .. ':delayed', id) == 1 then
    moved = moved + 1
    local h = redis.call('HMGET', tkey(id), 'status', 'AIGC', 'platform')
    if allowed(FROM.promote, h[1]) then enqueue(id, h[2], h[3]) end
  end
end
if moved > 0 and only == '' then redis.call('PUBLISH', P .. ':events', 'wake') end
return moved
