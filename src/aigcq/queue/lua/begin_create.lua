-- Record that a create is about to be sent for this attempt (so a process that restarts
-- knows one may be out), and give it the dispatch deadline from now. 0: the task moved on
-- (do not send). ARGV: prefix, taskId, attempt, createId, now, deadline
local id, attempt, now, deadline = ARGV[2], ARGV[3], ARGV[5], ARGV[6]
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if h[1] ~= 'dispatching' or h[2] ~= attempt then return 0 end
redis.call('HSET', k, 'createId', ARGV[4], 'createAt', now, 'deadline', deadline)
redis.call('ZADD', runkey(h[3], h[5]), 'XX', deadline, id)
redis.call('ZADD', P .. ':inflight', 'XX', deadline, id)
return 1
