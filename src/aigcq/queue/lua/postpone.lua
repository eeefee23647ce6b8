-- The target could not say how the task is doing: ask again later, with back-off
-- (0.5, 1, 2 ... up to ARGV[5] s). ARGV: prefix, taskId, attempt, now, max delay.
-- Returns the delay, or 0 when the task moved on.
local id, attempt, now, cap = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if (h[1] ~= 'dispatching' and h[1] ~= 'running') or h[2] ~= attempt then return 0 end
local n = redis.call('HINCRBY', k, 'unknowns', 1)
local delay = math.min(0.5 * 2 ^ (n - 1), cap)
redis.call('HSET', k, 'deadline', now + delay)
redis.call('ZADD', runkey(h[3], h[5]), 'XX', now + delay, id)
redis.call('ZADD', P .. ':inflight', 'XX', now + delay, id)
return tostring(delay)
