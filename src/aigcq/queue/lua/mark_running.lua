-- The target accepted the task. ARGV: prefix, taskId, attempt, now, remoteId, deadline,
-- kind ('callback' | 'polling'), callback-map ttl, allowed-from, progress ('' = none: the
-- ``progress:`` event published when the task's client asked for progress messages),
-- AIGC, platform, target, paid ('1': a remote task accepted for an attempt that is no
-- longer live is kept as an orphan, inside the account's cap, until it ends).
-- Returns 1 (running), 0 (moved on), 2 (moved on; the remote task is now an orphan).
local id, attempt, now, remote, deadline = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if h[1] == 'running' and h[2] == attempt and remote ~= '' and h[6] == remote then return 1 end
-- the same attempt, waiting as running for a create whose outcome was unknown: adopt it
local adopt = h[1] == 'running' and h[2] == attempt and remote ~= '' and (h[6] or '') == ''
if not adopt and (not allowed(ARGV[9], h[1]) or h[2] ~= attempt) then
  -- its own webhook, faster than the create's reply, already ended the task: nothing runs
  local ended = h[2] == attempt and redis.call('HGET', k, 'endedAttempt') == attempt
  if remote ~= '' and ARGV[14] == '1' and not ended then
    orphan(remote, id, attempt, ARGV[11], ARGV[12], ARGV[13], now)
    return 2
  end
  return 0
end
redis.call('HSET', k, 'status', 'running', 'remoteTaskId', remote, 'updated', now,
  'deadline', deadline)
if remote ~= '' then
  redis.call('SET', P .. ':callback:' .. remote, id, 'EX', ARGV[8])
  if ARGV[7] == 'polling' then redis.call('HSET', pollkey(h[3], h[4]), remote, id) end
end
redis.call('ZADD', runkey(h[3], h[5]), 'XX', deadline, id)
redis.call('ZADD', P .. ':inflight', 'XX', deadline, id)
note(id, now, 'running', attempt, h[5], remote)
if ARGV[10] and ARGV[10] ~= '' and h[7] and h[7] ~= ''
    and redis.call('HEXISTS', P .. ':progress', h[7]) == 1 then
  redis.call('PUBLISH', P .. ':events', 'progress:' .. ARGV[10])
end
return 1
