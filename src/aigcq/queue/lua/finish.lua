-- Move a live task to a terminal state, and queue its message for the client, atomically.
-- The live attempt's remote task on a paid target, unless it is the one that ended,
-- becomes an orphan, kept in its account's cap until it ends; its id is returned last so
-- the caller cancels it. A create whose outcome is unknown (recorded, no remote id) is
-- kept likewise as ``create:<createId>``. Whether applied or not, an ended run of
-- ``from_attempt`` releases that attempt's orphan, and its paid target is returned last
-- (``released``: that run was billed, and this is its one release: its charge is due).
-- ``cost``: what the reporting run cost; its charge is made due here (charge_due) when
-- this end is the one that bills it: applied on a paid target, or an orphan's release.
-- A success of a paid run that comes after its task ended failed or cancelled (the run was
-- an orphan) is kept on the task (keep_paid_result). ``replay_result`` ends such a task with
-- that result (a replay that pays nothing, as a new attempt), its client told as for any
-- success. Each message for the client names the attempt it ends (``attempt``). A failed
-- or cancelled end is listed for replays (``{P}:replayable``, while retained).
-- ``expire`` ends a waiting task that never ran (no attempt charged) whose start deadline
-- passed; any end takes the task out of the start deadlines' index (``{P}:startby``). A
-- successful run on a target that is not paid records its run time in its workflow's
-- recent mean (``{P}:runs``, the scheduler's estimates).
-- A success of the attempt a failure ``late_class`` gave up on (UncertainSubmit), while
-- that attempt's paid run is still counted, is left untouched for release_orphan.lua to
-- make it win (``late_success``): {3, state, orphan, its target}.
-- Returns {1, to, AIGC, platform, target, created, orphan, released},
-- {0, state, released} (not allowed), {2, state, released} (fenced: a superseded attempt),
-- {-1, ''} (unknown).
--! move finish
--! move withdraw
--! move replay_result
--! move expire
--! arg task_id
--! arg to               the terminal state
--! arg now
--! arg ttl              retention once terminal (s)
--! arg result_json
--! arg error_json
--! arg body             the client's message
--! arg minid            the outbox's MINID (ms)
--! arg info             its timeline note
--! arg move             finish | withdraw | replay_result (result_json, body: the kept one) | expire
--! arg quiet:flag       no message for the client
--! arg from_attempt     the attempt whose run reported this end ('' = none did, e.g. a cancel)
--! arg paid_targets     csv
--! arg fenced:flag      a failure: applied only while from_attempt is the live one
--! arg ended:flag       the run of from_attempt has ended
--! arg late_class       with to = success: the failure a late success of the same attempt overrides
--! arg cost             the reported cost, JSON ('' = no platform's answer)
-- policy.next_mean: the plain mean of a workflow's first RUN_WINDOW runs, then an
-- exponential moving average (``{P}:runs``: workflowId -> "<mean s> <count>")
local RUN_WINDOW = 20
local function record_run(workflow, run_s)
  local before = redis.call('HGET', P .. ':runs', workflow)
  local mean, count = 0, 0
  if before then
    local m, c = string.match(before, '^(%S+) (%S+)$')
    mean, count = tonumber(m) or 0, tonumber(c) or 0
  end
  count = math.min(count + 1, RUN_WINDOW)
  mean = mean + (math.max(run_s, 0) - mean) / count
  redis.call('HSET', P .. ':runs', workflow, string.format('%.17g %d', mean, count))
end
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return {-1, ''} end
local replay = move == 'replay_result'
local late = ''  -- the paid target of a late success, kept below
if to == SUCCESS and from_attempt ~= '' and (h[1] == FAILED or h[1] == CANCELLED) then
  late = orphan_target(task_id, from_attempt)
end
if late ~= '' and h[1] == FAILED and from_attempt == h[2] and failed_as(k, late_class) then
  return {3, h[1], redis.call('HGET', k, 'orphan.' .. from_attempt), late}
end
local released = ended and from_attempt ~= '' and orphan_ended(task_id, from_attempt) or ''
local function orphan_billed()  -- a run the task no longer wanted, billed all the same
  charge_due(task_id, from_attempt, released, cost, false, now)
end
if released ~= '' and from_attempt == h[2] then
  redis.call('HSET', k, 'endedAttempt', h[2])  -- a create reply still to come: nothing runs
end
if not allowed(FROM[move], h[1]) then
  if late ~= '' then keep_paid_result(task_id, result_json, late, from_attempt, now) end
  if move == 'expire' then redis.call('ZREM', P .. ':startby', task_id) end  -- it started
  orphan_billed()
  return {0, h[1], released}
end
if fenced and (h[2] ~= from_attempt or h[1] == PENDING) then
  orphan_billed()
  return {2, h[1], released}
end
if move == 'expire' and tonumber(redis.call('HGET', k, 'charged') or 0) > 0 then
  redis.call('ZREM', P .. ':startby', task_id)  -- it ran once: no start deadline any more
  return {0, h[1]}
end
if to == SUCCESS and h[1] == RUNNING and not paid(paid_targets, h[5]) then
  local run = redis.call('HMGET', k, 'started', 'workflowId')
  if run[1] then record_run(run[2] or '', tonumber(now) - tonumber(run[1])) end
end
redis.call('ZREM', P .. ':startby', task_id)
if replay then
  result_json = redis.call('HGET', k, 'paidResult')
  if not result_json then return {0, h[1]} end
  body = '{"result":' .. result_json .. '}'
  -- an operator's retry, answered from the kept result: the end of a new attempt
  h[2] = tostring(redis.call('HINCRBY', k, 'attempt', 1))
end
local orphaned = ''
local over = ended and from_attempt == h[2]
if not over and not replay then orphaned = orphan_live(task_id, h, paid_targets, now) end
if h[1] == PENDING then
  dequeue(task_id, h[3], h[4])
  redis.call('ZREM', P .. ':delayed', task_id)
end
unlink_inflight(task_id, h, now)
redis.call('HSET', k, 'status', to, 'updated', now, 'resultData', result_json, 'error', error_json)
if over then redis.call('HSET', k, 'endedAttempt', h[2]) end
note(task_id, now, to, h[2], h[5], info)
redis.call('EXPIRE', k, ttl)
redis.call('EXPIRE', tlkey(task_id), ttl)
if replay then
  redis.call('LREM', P .. ':recent', 0, task_id)
  redis.call('ZREM', P .. ':replayable', task_id)
else
  redis.call('HINCRBY', P .. ':finished', h[5] or '', 1)  -- counted once, when it first ended
end
redis.call('LPUSH', P .. ':recent', task_id)
redis.call('LTRIM', P .. ':recent', 0, 999)
if to == FAILED or to == CANCELLED then
  redis.call('ZADD', P .. ':replayable', now, task_id)
  redis.call('ZREMRANGEBYSCORE', P .. ':replayable', '-inf', tonumber(now) - tonumber(ttl))
end
if h[8] == '1' and not quiet then
  redis.call('XADD', P .. ':outbox:' .. h[7], 'MINID', '~', minid, '*',
    'taskId', task_id, 'status', to, 'body', body, 'attempt', h[2])
  redis.call('ZADD', P .. ':outboxes', now, h[7])  -- for the retention sweep (outbox.py)
  redis.call('PUBLISH', P .. ':events', 'outbox:' .. h[7])
end
-- A slot is free: wake the dispatchers when tasks wait for it. Bridge slots are shared
-- by every AIGC project, so freeing one always wakes them.
if h[1] ~= PENDING and (h[5] == 'bridge' or redis.call('ZCARD', waitkey(h[3], h[4])) > 0) then
  redis.call('PUBLISH', P .. ':events', 'wake')
end
local ran_on = released ~= '' and released or (h[5] or '')
if paid(paid_targets, ran_on) then
  charge_due(task_id, from_attempt ~= '' and from_attempt or h[2], ran_on, cost, true, now)
end
-- the labels of the task's metrics: AIGC, platform, target, created
return {1, to, h[3], h[4], h[5], redis.call('HGET', k, 'created'), orphaned, released}
