-- What a dispatch round weighs (issue 37, aigcq.scheduler.fair), read in one step: of each
-- queue, the first ``n`` waiting tasks of every ready key (a key: one end user's tasks of
-- one workflow; a paused workflow's keys are not ready, and a key whose user is at
-- ``user_limit`` is passed over with one ZCARD), so a held key costs nothing however deep
-- it is; then the ``dated`` waiting tasks of these queues with the earliest start
-- deadlines, wherever they sit; with the fields the planner needs, the tasks in flight on
-- the internal target in those projects (their workflow and when they started), every
-- workflow's recent mean run time, and the decayed usage of the projects and users read (a
-- task that started once, an attempt charged, has no start deadline any more).
-- ``truncated``: ``users_max`` left users (or keys) with ready work unread.
-- Returns it as JSON: {tasks = {{aigc, platform, id, created, workflowId, userId,
-- credit, startBy, keepWaiting}, ...}, busy = {{workflowId, started}, ...}, runs = {flat
-- HGETALL}, usage = {key = "<value> <at>"}, users = {"<aigc>\n<userId>" = tasks of that
-- user claimed for our GPUs (with user_limit > 0)}, running = {aigc = its tasks in flight
-- on the internal target}}.
--! no move: it only reads
--! arg queues          a JSON list of {aigc, platform}
--! arg n:num           tasks of each ready key's head
--! arg dated:num       waiting tasks with the earliest start deadlines read besides
--! arg target          the internal target's name (its running sets)
--! arg busy_max:num    tasks in flight read per project, at most (0: 4096 if dated; < 0: never)
--! arg user_limit:num  the per-user limit (0: none, their counts are not read)
--! arg users_max:num   per queue, the ready keys of this many users (0: every key; see read_heads)
--! arg by_rank:num     1: this many keys by rank instead (``AIGCQ_SHARES=false``)
local out = {tasks = {}, busy = {}, usage = {}, users = {}, running = {}}
local usage_keys, projects, served, seen, dated_any = {}, {}, {}, {}, false
local function want(key) usage_keys[key] = true end
local function limited(aigc, user)
  if user_limit <= 0 or user == '' then return false end
  local who = aigc .. '\n' .. user
  if out.users[who] == nil then out.users[who] = redis.call('ZCARD', userkey(aigc, user)) end
  return out.users[who] >= user_limit
end
local function add(aigc, platform, id)
  if seen[id] then return end
  seen[id] = true
  local f = redis.call('HMGET', tkey(id), 'created', 'workflowId', 'userId', 'credit',
    'startBy', 'keepWaiting', 'charged')
  if not f[1] then return end
  if tonumber(f[7] or 0) > 0 then f[5] = false end  -- it started once: no start deadline
  if f[5] then dated_any = true end
  out.tasks[#out.tasks + 1] = {aigc, platform, id, f[1], f[2] or '', f[3] or '',
    f[4] or '', f[5] or '', f[6] or ''}
  if f[3] then want(P .. ':usage:' .. aigc .. ':user:' .. f[3]) end
end
local function read_key(aigc, platform, key)
  for _, id in ipairs(redis.call('ZRANGE', bykey(aigc, platform, key), 0, n - 1)) do
    add(aigc, platform, id)
  end
end
-- Calls ``take(member)`` on the members of ZSET ``zset`` in order, a page at a time,
-- until ``users_max`` of them were taken (it returns whether it took one); then, if
-- members are left, marks the window ``truncated``.
local function each_taken(zset, take)
  local taken, from, page = 0, 0, math.max(users_max, 16)
  while true do
    local members = redis.call('ZRANGE', zset, from, from + page - 1)
    for i, member in ipairs(members) do
      if take(member) then
        taken = taken + 1
        if taken >= users_max then
          if i < #members or redis.call('ZCARD', zset) > from + i then out.truncated = true end
          return
        end
      end
    end
    if #members < page then return end
    from = from + page
  end
end
-- A queue's ready keys a round may need: all of them (``users_max`` 0), the ready keys of
-- the users fair shares put first (a user at its limit passed over), or the ready keys of
-- lowest rank (first come, first served). Fair order gives a round's first m places to
-- tasks of the m users it puts first, and rank order to the m keys of lowest rank, so
-- ``users_max`` = the places a round fills reads what it needs, however many users wait.
local function read_heads(aigc, platform)
  if users_max <= 0 then
    for _, key in ipairs(redis.call('ZRANGE', readyof(aigc, platform), 0, -1)) do
      if not limited(aigc, cjson.decode(key)[1]) then read_key(aigc, platform, key) end
    end
  elseif by_rank == 1 then
    each_taken(readyof(aigc, platform), function(key)
      if limited(aigc, cjson.decode(key)[1]) then return false end
      read_key(aigc, platform, key)
      return true
    end)
  else
    each_taken(usersof(aigc, platform), function(user)
      if limited(aigc, user) then return false end
      local keys = redis.call('ZRANGE', ureadyof(aigc, platform, user), 0, n - 1)
      for _, key in ipairs(keys) do read_key(aigc, platform, key) end
      return true
    end)
  end
end
for _, q in ipairs(cjson.decode(queues)) do
  local aigc, platform = q[1], q[2]
  served[aigc .. ':' .. platform] = true
  if not projects[aigc] then
    projects[aigc] = true
    want(P .. ':usage:' .. aigc)
    out.running[aigc] = redis.call('ZCARD', runkey(aigc, target))
  end
  read_heads(aigc, platform)
end
-- every start deadline counts, however deep its task: the earliest ones of these queues,
-- a limited user's too (its paid platform may keep it; its user's count is read with it)
if dated > 0 then
  for _, id in ipairs(redis.call('ZRANGE', P .. ':startby', 0, dated - 1)) do
    local h = redis.call('HMGET', tkey(id), 'AIGC', 'platform', 'status', 'workflowId', 'userId')
    if h[3] == PENDING and served[(h[1] or '') .. ':' .. (h[2] or '')]
      and not workflow_paused(h[4] or '') then
      limited(h[1], h[5] or '')
      add(h[1], h[2], id)
    end
  end
end
-- the busy slots' time left matters to a task's estimated start: read when a paid
-- platform has room (busy_max > 0) or a task read has a start deadline
if busy_max > 0 or (dated_any and busy_max == 0) then
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
