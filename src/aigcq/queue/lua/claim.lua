-- Move up to ARGV[7] tasks from a wait list to a target, never beyond the target's cap
-- (its tasks in flight plus the unwanted remote tasks still running there). Every claim
-- is a new attempt number (its own signed webhook URL) and charges one attempt.
-- ARGV: prefix, now, AIGC, platform, target, cap (-1 = no cap), n, deadline_s, allowed-from
local now, aigc, platform, target = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cap, n, dl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local wait, run = waitkey(aigc, platform), runkey(aigc, target)
local take = n
if cap >= 0 then
  take = math.min(n, cap - redis.call('ZCARD', run) - redis.call('ZCARD', orphkey(aigc, target)))
end
local deadline = tonumber(now) + dl
local out = {}
while take > 0 do
  local id = redis.call('LPOP', wait)
  if not id then break end
  local k = tkey(id)
  if allowed(ARGV[9], redis.call('HGET', k, 'status')) then
    local attempt = redis.call('HINCRBY', k, 'attempt', 1)
    local charged = redis.call('HINCRBY', k, 'charged', 1)
    redis.call('HSET', k, 'status', 'dispatching', 'target', target, 'updated', now,
      'deadline', deadline)
    redis.call('HDEL', k, 'createId', 'unknowns')
    redis.call('ZADD', run, deadline, id)
    redis.call('ZADD', P .. ':inflight', deadline, id)
    note(id, now, 'dispatching', attempt, target, '')
    local f = redis.call('HMGET', k, 'payload', 'backendId', 'workflowId', 'created', 'uncharged')
    out[#out + 1] = {id, attempt, f[1], f[2], f[3], f[4], charged, f[5] or 0}
    take = take - 1
  end
end
return out
