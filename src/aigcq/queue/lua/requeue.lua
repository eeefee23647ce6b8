-- Hand a task back to its wait queue (at its rank, among the oldest), or to the delayed set for back-off; its
-- next claim is a new attempt either way. One script for the moves back to waiting:
-- ``move`` names the one made, and its TaskStore method sets the rest. ``uncharge`` gives
-- back the attempt this one charged (the target never ran it), at most ``free_limit``
-- times per task. A retried paid failure's charge is due in the same step (``cost``).
-- Returns 1, 0 (not now: moved on, or refused), -1 (no such task).
--! move requeue_unrun
--! move requeue_unsent
--! move requeue_for_retry
--! move requeue_handed_back
--! arg move               one of the moves above
--! arg task_id
--! arg attempt            only while this is the live attempt
--! arg now
--! arg ready_at:num       back-off: not claimed before (0: at once, at the head)
--! arg reason             its timeline note
--! arg remote_id          '' or: only while the task still carries this remote id
--! arg unsent_only:flag   not while a create may be out for the attempt
--! arg uncharge:flag
--! arg free_limit:num
--! arg ended:flag         its remote task is known to be over (else a paid one is an orphan)
--! arg paid_targets       csv
--! arg cost               a paid run's failure: what it cost, JSON, its charge due ('' none)
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return -1 end
if not allowed(FROM[move], h[1]) or h[2] ~= attempt then return 0 end
if remote_id ~= '' and h[6] ~= remote_id then return 0 end
if unsent_only and h[9] then return 0 end
unlink_inflight(task_id, h, now)
if not ended then orphan_live(task_id, h, paid_targets, now) end
if uncharge then
  local free = redis.call('HINCRBY', k, 'uncharged', 1)
  if free <= free_limit and tonumber(redis.call('HGET', k, 'charged') or 0) > 0 then
    redis.call('HINCRBY', k, 'charged', -1)
  end
end
redis.call('HSET', k, 'status', TO[move], 'target', '', 'remoteTaskId', '', 'updated', now)
redis.call('HDEL', k, 'createId', 'createAt', 'unknowns')
if ready_at > tonumber(now) then
  redis.call('ZADD', P .. ':delayed', ready_at, task_id)
else
  enqueue(task_id, h[3], h[4])
end
note(task_id, now, TO[move], h[2], h[5], reason)
if paid(paid_targets, h[5]) then charge_due(task_id, h[2], h[5], cost, true, now) end
redis.call('PUBLISH', P .. ':events', 'wake')
return 1
