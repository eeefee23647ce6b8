-- Put a finished (failed / cancelled) task back at the tail of its wait queue; its next
-- claim is a new attempt, so callbacks signed for earlier attempts stay fenced off, and it
-- has its whole attempt budget again.
-- ARGV: prefix, taskId, now, allowed-from, note
local id, now = ARGV[2], ARGV[3]
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return {-1, ''} end
if not allowed(ARGV[4], h[1]) then return {0, h[1]} end
redis.call('HSET', k, 'status', 'pending', 'target', '', 'remoteTaskId', '', 'updated', now,
  'deadline', 0)
redis.call('HSET', k, 'charged', 0, 'uncharged', 0)
redis.call('HDEL', k, 'resultData', 'error', 'createId', 'createAt', 'unknowns', 'endedAttempt')
redis.call('PERSIST', k)
redis.call('PERSIST', tlkey(id))
redis.call('LREM', P .. ':recent', 0, id)
redis.call('RPUSH', waitkey(h[3], h[4]), id)
redis.call('SADD', P .. ':queues', h[3] .. ':' .. h[4])
note(id, now, 'pending', h[2], '', ARGV[5])
redis.call('PUBLISH', P .. ':events', 'wake')
return {1, 'pending'}
