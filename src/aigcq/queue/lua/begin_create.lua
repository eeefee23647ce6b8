-- Record that a create is about to be sent for this attempt (so a process that restarts
-- knows one may be out), and give it the dispatch deadline from now, unless a paid budget
-- of its project or account is reached (``gate``, see the prelude's budget_reached): the
-- check and the record are one step, so no process sends a create past a limit another
-- process's charge reached. At a limit with ``gate.hold`` (its project waits) the
-- project's paid target gets an automatic hold in ``{P}:pauses`` (``hold:budget:`` +
-- AIGC/target), which the dispatch rounds honour. Returns {1, ''}, {0, ''} when the task
-- moved on (send nothing), or {-1, what is reached, 1 if the hold is new}.
--! move begin_create
--! arg task_id
--! arg attempt
--! arg create_id   the id the create is recorded under (``create:<id>`` as an orphan)
--! arg now
--! arg deadline    when the dispatch times out (epoch s)
--! arg gate        the budgets to fit, JSON ('' = none)
local k = tkey(task_id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not allowed(FROM.begin_create, h[1]) or h[2] ~= attempt then return {0, ''} end
local reached = budget_reached(gate)
if reached ~= '' then
  local held = 0
  local b = cjson.decode(gate)
  if b.hold then
    held = redis.call('HSETNX', P .. ':pauses', 'hold:budget:' .. b.project .. '/' .. b.target,
      cjson.encode({since = tonumber(now), note = reached}))
  end
  return {-1, reached, held}
end
redis.call('HSET', k, 'createId', create_id, 'createAt', now, 'deadline', deadline)
redis.call('ZADD', runkey(h[3], h[5]), 'XX', deadline, task_id)
redis.call('ZADD', P .. ':inflight', 'XX', deadline, task_id)
return {1, ''}
