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

-- Waiting work kept by key (issue 37). A queue's waiting tasks are the ZSET ``waitkey``
-- (id -> rank: submitted minus its priority credit; the seed's WQtasks is its ZCARD), and
-- each of its keys, one (end user, workflow) pair, is a ZSET of its own (``bykey``). The
-- queue's keys with waiting work are ``keysof`` (key -> its head's rank); those not held by
-- a workflow pause are also ``readyof``: a round reads the ready keys' heads, never the
-- depth of a held key.
local function keysof(aigc, platform) return P .. ':wkeys:' .. aigc .. ':' .. platform end
local function readyof(aigc, platform) return P .. ':ready:' .. aigc .. ':' .. platform end
local function bykey(aigc, platform, key) return P .. ':wq:' .. aigc .. ':' .. platform .. ':' .. key end
-- The ready keys by end user, so a round reads the users fair shares put first, not every
-- user with work: ``usersof`` (user -> its fair place, ``user_place``) holds the users with
-- a ready key in the queue, ``ureadyof`` each one's ready keys (key -> its head's rank).
local function usersof(aigc, platform) return P .. ':rusers:' .. aigc .. ':' .. platform end
local function ureadyof(aigc, platform, user)
  return P .. ':ruready:' .. aigc .. ':' .. platform .. ':' .. user
end
local function usagekey(aigc, user) return P .. ':usage:' .. aigc .. ':user:' .. user end
-- a task's key: JSON {userId, workflowId}
local function key_of(id)
  local f = redis.call('HMGET', tkey(id), 'userId', 'workflowId')
  return cjson.encode({f[1] or '', f[2] or ''}), f[2] or ''
end
-- whether an operator paused ``workflow`` (aigcq.scheduler.pauses)
local function workflow_paused(workflow)
  return redis.call('HEXISTS', P .. ':pauses', 'workflow:' .. workflow) == 1
end
-- An end user's place among a queue's users, as fair shares order them (policy.fair_order:
-- the least recent GPU-seconds first, then the oldest task), as one score that time does
-- not change: a user who ran has log2(usage) + at / half-life (decay lowers every user's
-- usage by the same factor, so their order holds); one who did not (no record, or 0)
-- comes before all of them, by its oldest ready head's submit time.
local NEVER_RAN = 1e13
local function user_place(aigc, platform, user)
  local rec = user ~= '' and redis.call('GET', usagekey(aigc, user))
  if rec then
    local v, at, half = string.match(rec, '^(%S+) (%S+) (%S+)$')
    v, at, half = tonumber(v), tonumber(at), tonumber(half)
    if v and v > 0 and half and half > 0 then return math.log(v) / math.log(2) + at / half end
  end
  local key = redis.call('ZRANGE', ureadyof(aigc, platform, user), 0, 0)[1]
  local id = key and redis.call('ZRANGE', bykey(aigc, platform, key), 0, 0)[1]
  local created = id and tonumber(redis.call('HGET', tkey(id), 'created')) or 0
  return created - NEVER_RAN
end
-- ``user``'s ready ``key`` in (``rank``) or out (nil) of the queue's users index.
local function index_user(aigc, platform, user, key, rank)
  local mine = ureadyof(aigc, platform, user)
  if rank then
    redis.call('ZADD', mine, rank, key)
  elseif redis.call('ZREM', mine, key) == 0 then
    return
  end
  if redis.call('EXISTS', mine) == 0 then
    redis.call('ZREM', usersof(aigc, platform), user)
  else
    redis.call('ZADD', usersof(aigc, platform), user_place(aigc, platform, user), user)
  end
end
-- Index ``key`` of a queue again from its head: in ``keysof`` while it holds tasks, and in
-- ``readyof`` (and its user's ready keys) too unless its workflow is paused.
local function reindex(aigc, platform, key, workflow)
  local head = redis.call('ZRANGE', bykey(aigc, platform, key), 0, 0, 'WITHSCORES')
  local user = cjson.decode(key)[1]
  if #head == 0 then
    redis.call('ZREM', keysof(aigc, platform), key)
    redis.call('ZREM', readyof(aigc, platform), key)
    index_user(aigc, platform, user, key, nil)
    return
  end
  redis.call('ZADD', keysof(aigc, platform), head[2], key)
  if workflow_paused(workflow) then
    redis.call('ZREM', readyof(aigc, platform), key)
    index_user(aigc, platform, user, key, nil)
  else
    redis.call('ZADD', readyof(aigc, platform), head[2], key)
    index_user(aigc, platform, user, key, head[2])
  end
end
-- The users index of a queue that an aigcq before it kept by key (or that lost a step)
-- completed from its ready keys; run once by each dispatch loop as it starts
-- (``keyed.lua``). How many ready keys it indexed.
local function ensure_users(aigc, platform)
  local added, flat = 0, redis.call('ZRANGE', readyof(aigc, platform), 0, -1, 'WITHSCORES')
  for i = 1, #flat, 2 do
    local key = flat[i]
    local user = cjson.decode(key)[1]
    if not redis.call('ZSCORE', ureadyof(aigc, platform, user), key) then
      index_user(aigc, platform, user, key, flat[i + 1])
      added = added + 1
    end
  end
  return added
end
local function keyed(id, aigc, platform, rank)
  rank = rank or redis.call('HGET', tkey(id), 'rank') or redis.call('HGET', tkey(id), 'created')
  local key, workflow = key_of(id)
  redis.call('ZADD', waitkey(aigc, platform), rank, id)
  redis.call('ZADD', bykey(aigc, platform, key), rank, id)
  reindex(aigc, platform, key, workflow)
end
-- A queue an aigcq before issue 37 wrote is a LIST: its tasks move to the keyed layout
-- once, in one step, ranked as submitted (the first script that meets it, or the dispatch
-- loop's start: ``keyed.lua``).
local function ensure_keyed(aigc, platform)
  local wait = waitkey(aigc, platform)
  if redis.call('TYPE', wait).ok ~= 'list' then return end
  local ids = redis.call('LRANGE', wait, 0, -1)
  redis.call('DEL', wait)
  for _, id in ipairs(ids) do
    if redis.call('EXISTS', tkey(id)) == 1 then keyed(id, aigc, platform) end
  end
end
-- Queue task ``id`` (waiting) in its queue and its key, at its rank (its ``rank`` field,
-- else ``rank``).
local function enqueue(id, aigc, platform, rank)
  ensure_keyed(aigc, platform)
  keyed(id, aigc, platform, rank)
end
-- Take task ``id`` out of its queue and its key; whether it was waiting there.
local function dequeue(id, aigc, platform)
  ensure_keyed(aigc, platform)
  if redis.call('ZREM', waitkey(aigc, platform), id) == 0 then return false end
  local key, workflow = key_of(id)
  redis.call('ZREM', bykey(aigc, platform, key), id)
  reindex(aigc, platform, key, workflow)
  return true
end
-- The waiting task of lowest rank among a queue's ready keys (nil: none).
local function first_ready(aigc, platform)
  local key = redis.call('ZRANGE', readyof(aigc, platform), 0, 0)[1]
  if not key then return nil end
  return redis.call('ZRANGE', bykey(aigc, platform, key), 0, 0)[1]
end

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

-- A billed run's charge is due, written in the same step as the end that makes it so:
-- kept on its task (``due.<attempt>.<target>`` = "<ended at> <1: its record goes on the
-- task | 0: a run it no longer wanted> <cost JSON as reported>") and indexed in
-- ``{P}:dues`` until charge.lua charges it, once (aigcq.scheduler.spend). ``cost`` '': the
-- end reported none to charge (not a platform's answer).
local function charge_due(id, attempt, target, cost, on_task, now)
  if cost == '' or target == '' then return end
  local k = tkey(id)
  local written = redis.call('HSETNX', k, 'due.' .. attempt .. '.' .. target,
    now .. ' ' .. (on_task and '1' or '0') .. ' ' .. cost)
  if written == 1 then
    redis.call('HINCRBY', k, 'dues', 1)
    redis.call('ZADD', P .. ':dues', 'NX', now, id)
  end
end

-- Tasks that count against a project's cap on ``target``: in flight there, and its
-- unwanted remote tasks still running.
local function cap_used(aigc, target)
  return redis.call('ZCARD', runkey(aigc, target)) + redis.call('ZCARD', orphkey(aigc, target))
end
-- How many more tasks of ``aigc`` the paid account behind ``target`` takes over every
-- project that shares its key (``shared``: JSON {AIGC: [account cap, peer AIGC, ...]} of
-- the target's shared accounts, '' none): a key's cap is the account's, not each
-- project's (math.huge: ``aigc`` shares no key).
local function account_room(aigc, target, shared)
  if shared == '' then return math.huge end
  local account = cjson.decode(shared)[aigc]
  if not account then return math.huge end
  local used = cap_used(aigc, target)
  for i = 2, #account do used = used + cap_used(account[i], target) end
  return account[1] - used
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

-- An end user's usage changed: its place in the users index of each queue of its project
-- that holds a ready key of it (``user_place``).
local function replace_user(aigc, user)
  for _, queue in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
    local a, platform = string.match(queue, '^(.*):([^:]*)$')
    if a == aigc and redis.call('ZSCORE', usersof(a, platform), user) then
      redis.call('ZADD', usersof(a, platform), user_place(a, platform, user), user)
    end
  end
end
-- GPU-seconds a project and its end user ran on our GPUs (each
-- record "<GPU-seconds> <when> <half-life>", decayed with half-life ``half`` to ``now``
-- before ``seconds`` are added; never below 0; kept 20 half-lives after its last change).
local function use_gpu(aigc, user, seconds, now, half)
  local keys = {P .. ':usage:' .. aigc}
  if user and user ~= '' then keys[2] = usagekey(aigc, user) end
  for _, key in ipairs(keys) do
    local value, at = 0, now
    local before = redis.call('GET', key)
    if before then
      local v, t = string.match(before, '^(%S+) (%S+)')
      value, at = tonumber(v) or 0, tonumber(t) or now
    end
    value = math.max(value * math.pow(0.5, math.max(now - at, 0) / half) + seconds, 0)
    redis.call('SET', key, string.format('%.17g %.17g %.17g', value, now, half), 'EX',
      math.max(math.floor(half * 20), 1))
  end
  if keys[2] then replace_user(aigc, user) end
end
-- A run on our GPUs starts: its project and user are charged its workflow's recent mean
-- run time (``terms``: "<half-life s> <default run s>", the default before any run of
-- it), kept on the task (``gpu``: "<charged> <half-life>") to be corrected at its end.
local function gpu_started(id, aigc, now, terms)
  local half, default = string.match(terms, '^(%S+) (%S+)$')
  local k = tkey(id)
  local f = redis.call('HMGET', k, 'workflowId', 'userId')
  local mean = redis.call('HGET', P .. ':runs', f[1] or '')
  local expected = tonumber(mean and string.match(mean, '^(%S+)') or default) or 0
  use_gpu(aigc, f[2], expected, tonumber(now), tonumber(half))
  redis.call('HSET', k, 'gpu', string.format('%.17g %s', expected, half))
end
-- A run on our GPUs ended (or its task left it): the charge at its start is corrected to
-- the time it really ran. A task that never started was never charged.
local function gpu_ended(id, aigc, now)
  local k = tkey(id)
  local f = redis.call('HMGET', k, 'gpu', 'started', 'userId')
  if not f[1] then return end
  local charged, half = string.match(f[1], '^(%S+) (%S+)$')
  local ran = math.max(tonumber(now) - (tonumber(f[2]) or tonumber(now)), 0)
  use_gpu(aigc, f[3], ran - tonumber(charged), tonumber(now), tonumber(half))
  redis.call('HDEL', k, 'gpu')
end

-- Take a task out of every in-flight index. ``h`` = {status, attempt, AIGC, platform, target, remoteTaskId}
local function unlink_inflight(id, h, now)
  gpu_ended(id, h[3], now)
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
