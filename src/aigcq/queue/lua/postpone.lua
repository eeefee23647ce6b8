-- The target could not say how the task is doing: ask again later, with back-off (0.5,
-- 1, 2 ... up to ``max_delay`` s). Returns the delay, or 0 when the task moved on.
--! move postpone
--! arg task_id
--! arg attempt
--! arg now:num
--! arg max_delay:num
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not allowed(FROM.postpone, h[1]) or h[2] ~= attempt then return 0 end
local n = redis.call('HINCRBY', k, 'unknowns', 1)
local delay = math.min(0.5 * 2 ^ (n - 1), max_delay)
redis.call('HSET', k, 'deadline', now + delay)
redis.call('ZADD', runkey(h[3], h[5]), 'XX', now + delay, task_id)
redis.call('ZADD', P .. ':inflight', 'XX', now + delay, task_id)
return tostring(delay)
