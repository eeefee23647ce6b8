-- Hand a task claimed for one target to another before the first was sent anything (no
-- instance of the bridges can run it: it overflows to the paid platform), in the same
-- attempt, never beyond the new target's cap.
-- ARGV: prefix, taskId, attempt, now, from, to, cap (-1 = no cap), deadline_s, allowed-from
-- Returns 1 moved, 0 the new target is full, -1 the task moved on.
local id, attempt, now, from, to = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local cap, dl = tonumber(ARGV[7]), tonumber(ARGV[8])
local k = tkey(id)
local h = redis.call('HMGET', k, 'status', 'attempt', 'target', 'AIGC')
if not allowed(ARGV[9], h[1]) or h[2] ~= attempt or h[3] ~= from then return -1 end
local run = runkey(h[4], to)
if cap >= 0 and redis.call('ZCARD', run) + redis.call('ZCARD', orphkey(h[4], to)) >= cap then
  return 0
end
local deadline = tonumber(now) + dl
redis.call('ZREM', runkey(h[4], from), id)
redis.call('ZADD', run, deadline, id)
redis.call('ZADD', P .. ':inflight', deadline, id)
redis.call('HSET', k, 'target', to, 'updated', now, 'deadline', deadline)
note(id, now, 'dispatching', attempt, to, 'from ' .. from)
return 1
