-- Shared helpers, prepended to every script (then the lines aigcq.queue.scripts generates
-- from the script's declaration, then its body). ARGV[1] is always the key prefix; the key
-- patterns below are those of aigcq.queue.keys.
local P = ARGV[1]
local function tkey(id) return P .. ':task:' .. id end
local function tlkey(id) return P .. ':timeline:' .. id end
local function waitkey(aigc, platform) return P .. ':' .. aigc .. ':' .. platform .. ':wait' end
local function runkey(aigc, target) return P .. ':running:' .. aigc .. ':' .. target end
local function pollkey(aigc, platform) return P .. ':processPolling:' .. aigc .. ':' .. platform end
-- a project's end user's tasks claimed for our GPUs (ZSET id -> deadline), for its limit
local function userkey(aigc, user) return P .. ':userrun:' .. aigc .. ':' .. user end

-- ``csv`` is a comma-separated list of states (a move's FROM, from domain.TRANSITIONS).
local function allowed(csv, state)
  if not state then return false end
  return string.find(',' .. csv .. ',', ',' .. state .. ',', 1, true) ~= nil
end

-- A task's timeline keeps its first entry and its latest TIMELINE_MAX - 1.
local TIMELINE_MAX = 100
local function note(id, now, state, attempt, target, info)
  local n = redis.call('RPUSH', tlkey(id), cjson.encode({
    t = tonumber(now), state = state, attempt = tonumber(attempt) or 0,
    target = target or '', note = info or ''
  }))
  if n > TIMELINE_MAX then  -- drop the second entry (the oldest after 'submitted')
    redis.call('LSET', tlkey(id), 1, '-')
    redis.call('LREM', tlkey(id), 1, '-')
  end
end

-- Remote tasks we no longer want but that may still run on a paid platform: each keeps
-- its place in its account's cap (ZSET remoteId -> next check) until the platform says
-- it ended; ``{P}:orphan:{remoteId}`` tells which task and attempt it ran for. An attempt
-- has at most one: the task's hash names it (``orphan.<attempt>``), so that attempt's own
-- TASK_END releases exactly it. A create whose outcome is unknown (no remote id yet) is
-- kept as ``create:<createId>`` (with its ``createAt``) until its id, its webhook or its
-- deadline resolves it.
local function orphkey(aigc, target) return P .. ':orphans:' .. aigc .. ':' .. target end
local function unorphan(remote)
  local o = P .. ':orphan:' .. remote
  local h = redis.call('HMGET', o, 'AIGC', 'target', 'taskId', 'attempt')
  if not h[1] then return 0 end
  redis.call('ZREM', orphkey(h[1], h[2]), remote)
  redis.call('DEL', o)
  local field = 'orphan.' .. (h[4] or '0')
  if h[3] and redis.call('HGET', tkey(h[3]), field) == remote then
    redis.call('HDEL', tkey(h[3]), field)
  end
  redis.call('PUBLISH', P .. ':events', 'wake')  -- a slot is free
  return 1
end
local function orphan(remote, id, attempt, aigc, platform, target, now)
  local k, field = tkey(id), 'orphan.' .. (attempt or 0)
  local before = redis.call('HGET', k, field)
  if before and before ~= remote then unorphan(before) end  -- its create resolved
  redis.call('ZADD', orphkey(aigc, target), tonumber(now) + 1, remote)
  redis.call('HSET', P .. ':orphan:' .. remote, 'taskId', id, 'attempt', attempt or 0,
    'AIGC', aigc, 'platform', platform, 'target', target, 'since', now,
    'workflowId', redis.call('HGET', k, 'workflowId') or '')
  if redis.call('EXISTS', k) == 1 then redis.call('HSET', k, field, remote) end
end
-- The run of ``attempt`` of task ``id`` ended (its own TASK_END): its orphan, if any, is
-- released. Only the one that task and attempt name. Returns the paid target it ran on
-- ('' = none released): the one release of a billed run, so its caller charges it.
local function orphan_ended(id, attempt)
  local remote = redis.call('HGET', tkey(id), 'orphan.' .. attempt)
  if not remote then return '' end
  local o = redis.call('HMGET', P .. ':orphan:' .. remote, 'taskId', 'attempt', 'target')
  if o[1] ~= id or o[2] ~= attempt then
    redis.call('HDEL', tkey(id), 'orphan.' .. attempt)  -- released meanwhile
    return ''
  end
  unorphan(remote)
  return o[3] or ''
end

-- The paid target attempt ``attempt`` of task ``id`` runs on as an orphan ('' = none).
local function orphan_target(id, attempt)
  local remote = redis.call('HGET', tkey(id), 'orphan.' .. attempt)
  if not remote then return '' end
  local o = redis.call('HMGET', P .. ':orphan:' .. remote, 'taskId', 'attempt', 'target')
  if o[1] ~= id or o[2] ~= attempt then return '' end
  return o[3] or ''
end
-- A paid platform's success for a task that had ended failed or cancelled meanwhile (its
-- run was an orphan): kept on the task, so that a replay delivers it instead of paying for
-- a new run (retry.lua refuses, finish.lua's replay_result delivers).
local function keep_paid_result(id, result_json, target, attempt, now)
  redis.call('HSET', tkey(id), 'paidResult', result_json,
    'paidResultFrom', target .. ':' .. attempt, 'paidResultAt', now)
end

-- Whether the task at ``k`` failed with error code ``class`` (its ``error``'s ``code``).
local function failed_as(k, class)
  local ok, err = pcall(cjson.decode, redis.call('HGET', k, 'error') or 'null')
  return ok and type(err) == 'table' and err.code == class
end

-- ``csv`` lists the paid targets: their unwanted remote tasks are kept as orphans.
local function paid(csv, target)
  return target and target ~= '' and allowed(csv, target)
end

-- The live attempt's run on a paid target becomes an orphan, counted in its account's cap
-- until it ends: its remote task, or a create whose outcome is unknown (recorded, no remote
-- id) as ``create:<createId>`` with its ``createAt``. ``h`` = FIELDS. Returns its id ('').
local function orphan_live(id, h, csv, now)
  if not paid(csv, h[5]) then return '' end
  local orphaned, create_at = '', nil
  if h[6] and h[6] ~= '' then
    orphaned = h[6]
  elseif h[9] and h[9] ~= '' then
    orphaned, create_at = 'create:' .. h[9], redis.call('HGET', tkey(id), 'createAt') or now
  end
  if orphaned == '' then return '' end
  orphan(orphaned, id, h[2], h[3], h[4], h[5], now)
  if create_at then redis.call('HSET', P .. ':orphan:' .. orphaned, 'createAt', create_at) end
  return orphaned
end

-- Take a task out of every in-flight index. ``h`` = {status, attempt, AIGC, platform, target, remoteTaskId}
local function unlink_inflight(id, h)
  if h[5] and h[5] ~= '' then redis.call('ZREM', runkey(h[3], h[5]), id) end
  local user = redis.call('HGET', tkey(id), 'userId')
  if user then redis.call('ZREM', userkey(h[3], user), id) end
  redis.call('ZREM', P .. ':inflight', id)
  if h[6] and h[6] ~= '' then redis.call('HDEL', pollkey(h[3], h[4]), h[6]) end
end

local FIELDS = {'status', 'attempt', 'AIGC', 'platform', 'target', 'remoteTaskId', 'backendId', 'deliver',
  'createId'}

-- The paid budgets a create must fit (aigcq.scheduler.budgets writes ``gate``, JSON):
-- ``limits`` lists {scope, period, limit} (scope ``p``: the project's spend, ``a``: the
-- account's, in the spend hashes charge.lua keeps, named by ``day`` / ``month``), and
-- ``floor`` the account's balance floor (its ``remainCoins`` as last polled, in
-- ``{P}:account:{target}:{account}``). Returns '' (within them all, or no gate) or what
-- is reached.
local function budget_reached(gate)
  if gate == '' then return '' end
  local b = cjson.decode(gate)
  for _, l in ipairs(b.limits or {}) do
    local scope, period, limit = l[1], l[2], tonumber(l[3])
    local field, who = {'p', b.project, 'amount'}, 'project ' .. b.project
    if scope == 'a' then
      field, who = {'a', b.target, b.account, 'amount'}, 'account ' .. b.target .. '/' .. b.account
    end
    local key = P .. ':spend:' .. period .. ':' .. b[period]
    local spent = tonumber(redis.call('HGET', key, cjson.encode(field)) or '0')
    if spent >= limit then
      return who .. ': ' .. period .. ' budget ' .. tostring(limit) .. ' reached (' ..
        tostring(spent) .. ' spent in ' .. b[period] .. ')'
    end
  end
  if b.floor then
    local coins = redis.call('HGET', P .. ':account:' .. b.target .. ':' .. b.account, 'remainCoins')
    if coins and tonumber(coins) <= tonumber(b.floor) then
      return 'account ' .. b.target .. '/' .. b.account .. ': balance ' .. coins ..
        ' at or below its floor ' .. tostring(b.floor)
    end
  end
  return ''
end
