-- Put a finished (failed / cancelled) task back in its wait queue, ranked as submitted now; its next
-- claim is a new attempt, so callbacks signed for earlier attempts stay fenced off, and it
-- has its whole attempt budget again. Never so that a paid platform is paid twice: a task
-- with a paid result kept (keep_paid_result) is left for its delivery (finish.lua's
-- replay_result), one whose paid run may still be out (an orphan of it, a remote task or a
-- create whose outcome is unknown) is left as it is. Returns {1, state}, {0, state} (not
-- allowed from its state), {3, state} (a paid result is kept), {4, state, orphan} (a paid
-- run may be out), {-1, ''} (no such task).
--! move retry
--! arg task_id
--! arg now
--! arg info   its timeline note
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return {-1, ''} end
if not allowed(FROM.retry, h[1]) then return {0, h[1]} end
if redis.call('HEXISTS', k, 'paidResult') == 1 then return {3, h[1]} end
for _, field in ipairs(redis.call('HKEYS', k)) do
  if string.sub(field, 1, 7) == 'orphan.' then
    local attempt = string.sub(field, 8)
    if orphan_target(task_id, attempt) ~= '' then return {4, h[1], redis.call('HGET', k, field)} end
  end
end
redis.call('HSET', k, 'status', TO.retry, 'target', '', 'remoteTaskId', '', 'updated', now,
  'deadline', 0)
redis.call('HSET', k, 'charged', 0, 'uncharged', 0, 'rank', now)
redis.call('HDEL', k, 'resultData', 'error', 'createId', 'createAt', 'unknowns', 'endedAttempt')
redis.call('PERSIST', k)
redis.call('PERSIST', tlkey(task_id))
redis.call('LREM', P .. ':recent', 0, task_id)
redis.call('ZREM', P .. ':replayable', task_id)
enqueue(task_id, h[3], h[4], now)
redis.call('SADD', P .. ':queues', h[3] .. ':' .. h[4])
note(task_id, now, TO.retry, h[2], '', info)
redis.call('PUBLISH', P .. ':events', 'wake')
return {1, TO.retry}
