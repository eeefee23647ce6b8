-- The platform says an unwanted remote task ended: it leaves its account's cap.
-- ARGV: prefix, remoteId. Returns 1, or 0 when it was not an orphan.
local remote = ARGV[2]
local h = redis.call('HMGET', P .. ':orphan:' .. remote, 'AIGC', 'target')
if not h[1] then return 0 end
redis.call('ZREM', orphkey(h[1], h[2]), remote)
redis.call('DEL', P .. ':orphan:' .. remote)
redis.call('PUBLISH', P .. ':events', 'wake')
return 1
