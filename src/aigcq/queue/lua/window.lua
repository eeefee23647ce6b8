-- What a dispatch round of the fair policy weighs (issue 27, aigcq.scheduler.fair), read in
-- one step: the first ``n`` waiting tasks of each queue (its look-ahead window) with the
-- fields the planner needs, the tasks in flight on the internal target in those projects
-- (their workflow and when they started, for the time left of each busy slot), every
-- workflow's recent mean run time, and the decayed usage of the window's projects and
-- users (a task that started once, an attempt charged, has no start deadline any more).
-- Returns it as JSON: {tasks = {{aigc, platform, id, created, workflowId, userId,
-- credit, startBy, keepWaiting}, ...}, busy = {{workflowId, started}, ...}, runs = {flat
-- HGETALL}, usage = {key = "<value> <at>"}, users = {"<aigc>\n<userId>" = tasks of that
-- user claimed for our GPUs (with user_limit > 0)}}.
--! no move: it only reads
--! arg queues          a JSON list of {aigc, platform}
--! arg n:num           tasks of each queue's head
--! arg start:num       from this index of each queue's list (a page further back: 0, the head)
--! arg target          the internal target's name (its running sets)
--! arg busy_max:num    tasks in flight read per project, at most (0: 4096 if dated; < 0: never)
--! arg user_limit:num  the per-user limit (0: none, their counts are not read)
local out = {tasks = {}, busy = {}, usage = {}, users = {}}
local usage_keys, projects, dated = {}, {}, false
local function want(key) usage_keys[key] = true end
for _, q in ipairs(cjson.decode(queues)) do
  local aigc, platform = q[1], q[2]
  if not projects[aigc] then
    projects[aigc] = true
    want(P .. ':usage:' .. aigc)
  end
  for _, id in ipairs(redis.call('LRANGE', waitkey(aigc, platform), start, start + n - 1)) do
    local f = redis.call('HMGET', tkey(id), 'created', 'workflowId', 'userId', 'credit',
      'startBy', 'keepWaiting', 'charged')
    if tonumber(f[7] or 0) > 0 then f[5] = false end  -- it started once: no start deadline
    if f[5] then dated = true end
    if f[1] then
      out.tasks[#out.tasks + 1] = {aigc, platform, id, f[1], f[2] or '', f[3] or '',
        f[4] or '', f[5] or '', f[6] or ''}
      if f[3] then
        want(P .. ':usage:' .. aigc .. ':user:' .. f[3])
        if user_limit > 0 then
          out.users[aigc .. '\n' .. f[3]] = redis.call('ZCARD', userkey(aigc, f[3]))
        end
      end
    end
  end
end
-- the busy slots' time left matters to a task's estimated start: read when a paid
-- platform has room (busy_max > 0) or a task of the window has a start deadline
if busy_max > 0 or (dated and busy_max == 0) then
  local limit = math.max(busy_max, 4096)
  for aigc in pairs(projects) do
    for _, id in ipairs(redis.call('ZRANGE', runkey(aigc, target), 0, limit - 1)) do
      local b = redis.call('HMGET', tkey(id), 'workflowId', 'started')
      out.busy[#out.busy + 1] = {b[1] or '', b[2] or ''}
    end
  end
end
out.runs = redis.call('HGETALL', P .. ':runs')
for key in pairs(usage_keys) do
  local v = redis.call('GET', key)
  if v then out.usage[key] = v end
end
return cjson.encode(out)
