-- Record that a create is about to be sent for this attempt (so a process that restarts
-- knows one may be out), and give it the dispatch deadline from now. Returns 1, or 0 when
-- the task moved on (send nothing).
--! move begin_create
--! arg task_id
--! arg attempt
--! arg create_id   the id the create is recorded under (``create:<id>`` as an orphan)
--! arg now
--! arg deadline    when the dispatch times out (epoch s)
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not allowed(FROM.begin_create, h[1]) or h[2] ~= attempt then return 0 end
redis.call('HSET', k, 'createId', create_id, 'createAt', now, 'deadline', deadline)
redis.call('ZADD', runkey(h[3], h[5]), 'XX', deadline, task_id)
redis.call('ZADD', P .. ':inflight', 'XX', deadline, task_id)
return 1
