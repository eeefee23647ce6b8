-- The target accepted the task, as ``remote_id`` ('' when the create's outcome is unknown:
-- it waits as running for its webhook). With a ``holder`` (a bridge), the task is recorded
-- as held by it in the same step: its tasks hash (taskId -> attempt) and the task's hash of
-- the bridges holding it (bridgeId -> attempt), both kept ``holder_ttl`` s. ``progress``: a
-- ``progress:`` event published only when the task's client is connected with
-- ``progress=1``. Returns 1 (running), 0 (moved on), 2 (moved on; the remote task is now
-- an orphan), 3 (the reply of a create whose task failed ``late_class`` (UncertainSubmit)
-- for want of it: the remote task is an orphan, ``awaited``: not cancelled, since its
-- success still wins, see release_orphan.lua).
--! move mark_running
--! arg task_id
--! arg attempt
--! arg now
--! arg remote_id
--! arg deadline        when the run times out (epoch s)
--! arg kind            'callback' | 'polling' (a polled task is listed for its poller)
--! arg callback_ttl    how long ``{P}:callback:{remote_id}`` names the task (s)
--! arg progress        the body of the progress event ('' = none)
--! arg aigc            with on_paid: the account the orphan counts against
--! arg platform
--! arg target
--! arg on_paid:flag    a remote task accepted for an attempt no longer live is kept as an orphan
--! arg holder          the bridge holding the task ('' = none)
--! arg holder_tasks    its tasks hash (keys.bridge_tasks)
--! arg holder_of       the task's bridges hash (keys.bridges_of)
--! arg holder_ttl
--! arg late_class      the failure whose attempt's remote task is awaited, not cancelled
--! arg usage_terms     our GPUs: "<half-life s> <default run s>" (a start charges usage; '': none)
local function hold()
  if holder == '' then return end
  redis.call('HSET', holder_tasks, task_id, attempt)
  redis.call('EXPIRE', holder_tasks, holder_ttl)
  redis.call('HSET', holder_of, holder, attempt)
  redis.call('EXPIRE', holder_of, holder_ttl)
end
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
local running = TO.mark_running
if h[1] == running and h[2] == attempt and remote_id ~= '' and h[6] == remote_id then
  hold()
  return 1
end
-- the same attempt, waiting as running for a create whose outcome was unknown: adopt it
local adopt = h[1] == running and h[2] == attempt and remote_id ~= '' and (h[6] or '') == ''
if not adopt and (not allowed(FROM.mark_running, h[1]) or h[2] ~= attempt) then
  -- its own webhook, faster than the create's reply, already ended the task: nothing runs
  local ended = h[2] == attempt and redis.call('HGET', k, 'endedAttempt') == attempt
  if remote_id ~= '' and on_paid and not ended and h[1] then  -- (a task long gone: none)
    orphan(remote_id, task_id, attempt, aigc, platform, target, now)
    if h[1] == FAILED and h[2] == attempt and failed_as(k, late_class) then
      redis.call('HSET', P .. ':orphan:' .. remote_id, 'awaited', 1)
      return 3
    end
    return 2
  end
  return 0
end
redis.call('HSET', k, 'status', running, 'remoteTaskId', remote_id, 'updated', now,
  'deadline', deadline, 'started', now)
if usage_terms ~= '' and not adopt then gpu_started(task_id, h[3], now, usage_terms) end
if remote_id ~= '' then
  redis.call('SET', P .. ':callback:' .. remote_id, task_id, 'EX', callback_ttl)
  if kind == 'polling' then redis.call('HSET', pollkey(h[3], h[4]), remote_id, task_id) end
end
redis.call('ZADD', runkey(h[3], h[5]), 'XX', deadline, task_id)
redis.call('ZADD', P .. ':inflight', 'XX', deadline, task_id)
note(task_id, now, running, attempt, h[5], remote_id)
if progress ~= '' and h[7] and h[7] ~= ''
    and redis.call('HEXISTS', P .. ':progress', h[7]) == 1 then
  redis.call('PUBLISH', P .. ':events', 'progress:' .. progress)
end
hold()
return 1
