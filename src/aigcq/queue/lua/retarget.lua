-- Hand a task claimed for one target to another before the first was sent anything (no
-- instance of the bridges can run it: it overflows to the paid platform), in the same
-- attempt, never beyond the new target's cap. Returns 1 moved, 0 the new target is full,
-- -1 the task moved on.
--! move retarget
--! arg task_id
--! arg attempt
--! arg now
--! arg source           the target it was claimed for
--! arg target           the target it goes to
--! arg cap:num          the new target's cap (-1: none)
--! arg deadline_s:num   how long from now the new target has to accept it
--! arg shared           the target's keys shared by projects (``account_room``; '' none)
local k = tkey(task_id)
local h = redis.call('HMGET', k, 'status', 'attempt', 'target', 'AIGC')
if not allowed(FROM.retarget, h[1]) or h[2] ~= attempt or h[3] ~= source then return -1 end
local run = runkey(h[4], target)
if (cap >= 0 and cap_used(h[4], target) >= cap) or account_room(h[4], target, shared) <= 0 then
  return 0
end
local deadline = tonumber(now) + deadline_s
redis.call('ZREM', runkey(h[4], source), task_id)
local user = redis.call('HGET', k, 'userId')
if user then redis.call('ZREM', userkey(h[4], user), task_id) end  -- off our GPUs
redis.call('ZADD', run, deadline, task_id)
redis.call('ZADD', P .. ':inflight', deadline, task_id)
redis.call('HSET', k, 'target', target, 'updated', now, 'deadline', deadline)
note(task_id, now, TO.retarget, attempt, target, 'from ' .. source)
return 1
