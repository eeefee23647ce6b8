-- Create a task and queue it at its rank (now, less its priority credit). A task id that exists already
-- is left as it is. Returns {1 created | 0 existing, its state, its backendId}.
--! move submit
--! arg task_id
--! arg now
--! arg aigc
--! arg platform
--! arg backend_id
--! arg payload       its payload, JSON
--! arg workflow_id   the workflow or model the payload names
--! arg deliver       '1': its result is queued for its client ('0': never)
--! arg max_cost      the most it may cost on a paid platform ('': no limit)
--! arg order         its scheduling fields (issue 27), a flat JSON list of field, value
--! arg expires_at    its start deadline when it expires past it (epoch s; '': never)
local k = tkey(task_id)
local cur = redis.call('HMGET', k, 'status', 'backendId')
if cur[1] then return {0, cur[1], cur[2]} end
redis.call('HSET', k, 'taskId', task_id, 'platform', platform, 'AIGC', aigc, 'backendId',
  backend_id, 'payload', payload, 'workflowId', workflow_id, 'deliver', deliver,
  'status', TO.submit, 'attempt', 0, 'created', now, 'updated', now)
if max_cost ~= '' then redis.call('HSET', k, 'maxCost', max_cost) end
if order ~= '[]' then redis.call('HSET', k, unpack(cjson.decode(order))) end
if expires_at ~= '' then redis.call('ZADD', P .. ':startby', expires_at, task_id) end
local rank = tonumber(now) - tonumber(redis.call('HGET', k, 'credit') or 0)
if rank ~= tonumber(now) then redis.call('HSET', k, 'rank', rank) end
enqueue(task_id, aigc, platform, rank)
redis.call('SADD', P .. ':queues', aigc .. ':' .. platform)
note(task_id, now, TO.submit, 0, '', 'submitted')
redis.call('PUBLISH', P .. ':events', 'wake')
return {1, TO.submit, backend_id}
