-- ARGV: prefix, taskId, now, AIGC, platform, backendId, payload, workflowId, deliver
local id, now, aigc, platform = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local k = tkey(id)
local cur = redis.call('HMGET', k, 'status', 'backendId')
if cur[1] then return {0, cur[1], cur[2]} end
redis.call('HSET', k, 'taskId', id, 'platform', platform, 'AIGC', aigc, 'backendId', ARGV[6],
  'payload', ARGV[7], 'workflowId', ARGV[8], 'deliver', ARGV[9], 'status', 'pending',
  'attempt', 0, 'created', now, 'updated', now)
redis.call('RPUSH', waitkey(aigc, platform), id)
redis.call('SADD', P .. ':queues', aigc .. ':' .. platform)
note(id, now, 'pending', 0, '', 'submitted')
redis.call('PUBLISH', P .. ':events', 'wake')
return {1, 'pending', ARGV[6]}
