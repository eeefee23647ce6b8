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

local function note(id, now, state, attempt, target, info)
  redis.call('RPUSH', tlkey(id), cjson.encode({
    t = tonumber(now), state = state, attempt = tonumber(attempt) or 0,
    target = target or '', note = info or ''
  }))
end

-- Take a task out of every in-flight index. ``h`` = {status, attempt, AIGC, platform, target, remoteTaskId}
local function unlink_inflight(id, h)
  if h[5] and h[5] ~= '' then redis.call('ZREM', runkey(h[3], h[5]), id) end
  redis.call('ZREM', P .. ':inflight', id)
  if h[6] and h[6] ~= '' then redis.call('HDEL', pollkey(h[3], h[4]), h[6]) end
end

local FIELDS = {'status', 'attempt', 'AIGC', 'platform', 'target', 'remoteTaskId', 'backendId', 'deliver'}
