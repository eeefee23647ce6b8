-- Shared helpers, prepended to every script. ARGV[1] is always the key prefix.
local P = ARGV[1]
local function tkey(id) return P .. ':task:' .. id end
local function tlkey(id) return P .. ':timeline:' .. id end
local function waitkey(aigc, platform) return P .. ':' .. aigc .. ':' .. platform .. ':wait' end
local function runkey(aigc, target) return P .. ':running:' .. aigc .. ':' .. target end
local function pollkey(aigc, platform) return P .. ':processPolling:' .. aigc .. ':' .. platform end

-- ``csv`` is the comma-separated list of allowed from-states (from domain.TRANSITIONS).
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
-- it ended; ``{P}:orphan:{remoteId}`` tells which task and attempt it ran for.
local function orphkey(aigc, target) return P .. ':orphans:' .. aigc .. ':' .. target end
local function orphan(remote, id, attempt, aigc, platform, target, now)
  redis.call('ZADD', orphkey(aigc, target), tonumber(now) + 1, remote)
  redis.call('HSET', P .. ':orphan:' .. remote, 'taskId', id, 'attempt', attempt or 0,
    'AIGC', aigc, 'platform', platform, 'target', target, 'since', now,
    'workflowId', redis.call('HGET', tkey(id), 'workflowId') or '')
end

-- ``csv`` lists the paid targets: their unwanted remote tasks are kept as orphans.
local function paid(csv, target)
  return target and target ~= '' and allowed(csv, target)
end

-- Take a task out of every in-flight index. ``h`` = {status, attempt, AIGC, platform, target, remoteTaskId}
local function unlink_inflight(id, h)
  if h[5] and h[5] ~= '' then redis.call('ZREM', runkey(h[3], h[5]), id) end
  redis.call('ZREM', P .. ':inflight', id)
  if h[6] and h[6] ~= '' then redis.call('HDEL', pollkey(h[3], h[4]), h[6]) end
end

local FIELDS = {'status', 'attempt', 'AIGC', 'platform', 'target', 'remoteTaskId', 'backendId', 'deliver',
  'createId'}
