-- Charge a billed run whose charge is due (``due``, a field charge_due wrote on its task
-- with the end that billed it), once: the field goes in the same step. Add it to the
-- spend hashes of its day and month, per project, account and workflow (fields ``["w", AIGC, target, account,
-- workflow, figure]``) with the project's (``["p", AIGC, figure]``) and the account's
-- (``["a", target, account, figure]``) totals beside, each a JSON list; keep the record on
-- the task (``cost``) when the due says so. Figures that are 0 are not added (a reader
-- takes a missing one as 0). The layout is read back by aigcq.scheduler.spend. Returns 1,
-- 0 when it is not due (charged already, or an unknown task).
--! no move: it records what a finished task cost, not its state
--! arg task_id
--! arg due               the field of the due charge (``due.<attempt>.<target>``)
--! arg target
--! arg account
--! arg default_workflow  the workflow a task that names none ran (JimuAI: the account's)
--! arg day               e.g. 2026-12-02
--! arg month             e.g. 2026-12
--! arg day_keep:num      seconds the day's hash is kept after its last charge
--! arg month_keep:num
--! arg record            the task's cost record, JSON (kept if the due says it goes on the task)
--! arg amount            the figures, as decimal strings
--! arg estimated
--! arg coins
--! arg seconds
local k = tkey(task_id)
local f = redis.call('HMGET', k, 'AIGC', 'workflowId', due)
if not f[1] or not f[3] then return 0 end
redis.call('HDEL', k, due)
if redis.call('HINCRBY', k, 'dues', -1) <= 0 then
  redis.call('HDEL', k, 'dues')
  redis.call('ZREM', P .. ':dues', task_id)
end
local aigc, workflow = f[1], f[2] or ''
if workflow == '' then workflow = default_workflow end
local figures = {{'amount', amount}, {'estimated', estimated}, {'coins', coins},
  {'seconds', seconds}, {'tasks', '1'}}
local rows = {{'w', aigc, target, account, workflow}, {'p', aigc}, {'a', target, account}}
for _, period in ipairs({{':spend:day:' .. day, day_keep}, {':spend:month:' .. month, month_keep}}) do
  local key = P .. period[1]
  for _, names in ipairs(rows) do
    for _, figure in ipairs(figures) do
      if tonumber(figure[2]) ~= 0 then
        local field = {unpack(names)}
        field[#field + 1] = figure[1]
        redis.call('HINCRBYFLOAT', key, cjson.encode(field), figure[2])
      end
    end
  end
  redis.call('EXPIRE', key, period[2])
end
if string.match(f[3], '^%S+ 1 ') then redis.call('HSET', k, 'cost', record) end
return 1
