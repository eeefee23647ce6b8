-- Hand a task back to its wait queue (head or tail), or to the delayed set for back-off.
-- Its next claim is a new attempt either way; ``uncharge`` gives back the attempt this one
-- charged (the target never ran it), at most ``free limit`` times per task.
-- ARGV: prefix, taskId, attempt ('' = any), now, ready_at, front (1/0), uncharge (1/0),
-- reason, allowed-from, remoteTaskId (optional: only while the task still has this remote
-- id), free limit, paid targets (csv), ended ('1': its remote task is known to be over),
-- unsent only ('1': refused while a create may be out for this attempt)
local id, attempt, now, ready = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return -1 end
if not allowed(ARGV[9], h[1]) or (attempt ~= '' and h[2] ~= attempt) then return 0 end
if ARGV[10] ~= '' and h[6] ~= ARGV[10] then return 0 end
if ARGV[14] == '1' and h[9] then return 0 end
unlink_inflight(id, h)
if ARGV[13] ~= '1' then orphan_live(id, h, ARGV[12], now) end
if ARGV[7] == '1' then
  local free = redis.call('HINCRBY', k, 'uncharged', 1)
  if free <= tonumber(ARGV[11]) and tonumber(redis.call('HGET', k, 'charged') or 0) > 0 then
    redis.call('HINCRBY', k, 'charged', -1)
  end
end
redis.call('HSET', k, 'status', 'pending', 'target', '', 'remoteTaskId', '', 'updated', now)
redis.call('HDEL', k, 'createId', 'createAt', 'unknowns')
if ready > tonumber(now) then
  redis.call('ZADD', P .. ':delayed', ready, id)
elseif ARGV[6] == '1' then
  redis.call('LPUSH', waitkey(h[3], h[4]), id)
else
  redis.call('RPUSH', waitkey(h[3], h[4]), id)
end
note(id, now, 'pending', h[2], h[5], ARGV[8])
redis.call('PUBLISH', P .. ':events', 'wake')
return 1
