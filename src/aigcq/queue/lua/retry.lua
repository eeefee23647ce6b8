-- Put a finished (failed / cancelled) task back at the tail of its wait queue; its next
-- claim is a new attempt, so callbacks signed for earlier attempts stay fenced off, and it
-- has its whole attempt budget again. Returns {1, state}, {0, state} (not allowed from
-- its state), {-1, ''} (no such task).
--! move retry
--! arg task_id
--! arg now
--! arg info   its timeline note
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return {-1, ''} end
if not allowed(FROM.retry, h[1]) then return {0, h[1]} end
redis.call('HSET', k, 'status', TO.retry, 'target', '', 'remoteTaskId', '', 'updated', now,
  'deadline', 0)
redis.call('HSET', k, 'charged', 0, 'uncharged', 0)
redis.call('HDEL', k, 'resultData', 'error', 'createId', 'createAt', 'unknowns', 'endedAttempt')
redis.call('PERSIST', k)
redis.call('PERSIST', tlkey(task_id))
redis.call('LREM', P .. ':recent', 0, task_id)
redis.call('RPUSH', waitkey(h[3], h[4]), task_id)
redis.call('SADD', P .. ':queues', h[3] .. ':' .. h[4])
note(task_id, now, TO.retry, h[2], '', info)
redis.call('PUBLISH', P .. ':events', 'wake')
return {1, TO.retry}
