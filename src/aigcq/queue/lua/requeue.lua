-- Hand a task back to its wait queue (head or tail), or to the delayed set for back-off.
-- ARGV: prefix, taskId, attempt ('' = any), now, ready_at, front (1/0), refund (1/0), reason,
-- allowed-from, remoteTaskId (optional: only while the task still has this remote id)
local id, attempt, now, ready = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return -1 end
if not allowed(ARGV[9], h[1]) or (attempt ~= '' and h[2] ~= attempt) then return 0 end
if ARGV[10] and ARGV[10] ~= '' and h[6] ~= ARGV[10] then return 0 end
unlink_inflight(id, h)
local a = tonumber(h[2])
if ARGV[7] == '1' and a > 0 then a = redis.call('HINCRBY', k, 'attempt', -1) end
redis.call('HSET', k, 'status', 'pending', 'target', '', 'remoteTaskId', '', 'updated', now)
if ready > tonumber(now) then
  redis.call('ZADD', P .. ':delayed', ready, id)
elseif ARGV[6] == '1' then
  redis.call('LPUSH', waitkey(h[3], h[4]), id)
else
  redis.call('RPUSH', waitkey(h[3], h[4]), id)
end
note(id, now, 'pending', a, h[5], ARGV[8])
redis.call('PUBLISH', P .. ':events', 'wake')
return 1
