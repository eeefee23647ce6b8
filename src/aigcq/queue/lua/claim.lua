-- Move up to ``n`` waiting tasks of a queue to a target, never beyond the target's cap
-- (its tasks in flight plus the unwanted remote tasks still running there), nor beyond
-- its account's when projects share a key (``account_room``): the lowest
-- ranked of its ready keys (first come, first served; a paused workflow's keys are not
-- ready), or those of ``ids`` still waiting (in that order; one another process claimed
-- meanwhile is skipped). Each take costs the same at any depth. Every claim is a new attempt number
-- (its own signed webhook URL) and charges one attempt. Returns a row per task claimed:
-- {taskId, attempt, payload, backendId, workflowId, created, charged, uncharged, userId,
-- trace, since}: its trace context ('' untraced) and when it began to wait (its last move).
-- With ``user_limit`` > 0 (claimed by ids for our GPUs), a task whose end user
-- (``userId``) has that many claimed for our GPUs already is passed over (it keeps its
-- place); each one claimed counts until it ends, goes back to waiting or to a paid target.
--! move claim
--! arg now
--! arg aigc
--! arg platform
--! arg target
--! arg cap:num          -1: no cap
--! arg n:num            how many to claim at most
--! arg deadline_s:num   how long from now the target has to accept each one
--! arg ids              '' (the head), or a JSON list of the task ids to claim
--! arg user_limit:num   most tasks of one userId claimed at once (0: no limit; with ids)
--! arg shared           the target's keys shared by projects (``account_room``; '' none)
local run = runkey(aigc, target)
local following = function()
  local id = first_ready(aigc, platform)
  if id then dequeue(id, aigc, platform) end
  return id
end
if ids ~= '' then
  local listed, i = cjson.decode(ids), 0
  following = function()
    while i < #listed do
      i = i + 1
      local user = user_limit > 0 and redis.call('HGET', tkey(listed[i]), 'userId')
      local full = user and redis.call('ZCARD', userkey(aigc, user)) >= user_limit
      if not full and dequeue(listed[i], aigc, platform) then return listed[i] end
    end
    return nil
  end
end
local take = math.min(n, account_room(aigc, target, shared))
if cap >= 0 then take = math.min(take, cap - cap_used(aigc, target)) end
local deadline = tonumber(now) + deadline_s
local out = {}
while take > 0 do
  local id = following()
  if not id then break end
  local k = tkey(id)
  local cur = redis.call('HMGET', k, 'status', 'updated')
  if allowed(FROM.claim, cur[1]) then
    local attempt = redis.call('HINCRBY', k, 'attempt', 1)
    local charged = redis.call('HINCRBY', k, 'charged', 1)
    redis.call('HSET', k, 'status', TO.claim, 'target', target, 'updated', now,
      'deadline', deadline)
    redis.call('HDEL', k, 'createId', 'unknowns')
    redis.call('ZADD', run, deadline, id)
    redis.call('ZADD', P .. ':inflight', deadline, id)
    if user_limit > 0 then
      local user = redis.call('HGET', k, 'userId')
      if user then redis.call('ZADD', userkey(aigc, user), deadline, id) end
    end
    note(id, now, TO.claim, attempt, target, '')
    local f = redis.call('HMGET', k, 'payload', 'backendId', 'workflowId', 'created', 'uncharged',
      'userId', 'trace')
    out[#out + 1] = {id, attempt, f[1], f[2], f[3], f[4], charged, f[5] or 0, f[6] or '',
      f[7] or '', cur[2] or ''}
    take = take - 1
  end
end
return out
