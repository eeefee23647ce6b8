-- Move a live task to a terminal state, and queue its message for the client, atomically.
-- ARGV: prefix, taskId, to-state, now, retention_s, result json, error json, message body,
-- outbox MINID, note, allowed-from, quiet ('1': no message for the client), from attempt
-- (the attempt whose run reported this end; '' = none did, e.g. a cancel), paid targets
-- (csv), fenced ('1': a failure, applied only while ``from attempt`` is the live one),
-- ended ('1': the run of ``from attempt`` has ended). The live attempt's remote task on a
-- paid target, unless it is the one that ended, becomes an orphan, kept in its account's
-- cap until it ends; its id is returned last so the caller cancels it. A create whose
-- outcome is unknown (recorded, no remote id) is kept likewise as ``create:<createId>``.
-- Whether applied or not, an ended run of ``from attempt`` releases that attempt's orphan.
-- Returns {1, to, AIGC, platform, target, created, orphan},
-- {0, state} (not allowed), {2, state} (fenced: a superseded attempt), {-1, ''} (unknown).
local id, to, now, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local k = tkey(id)
local h = redis.call('HMGET', k, unpack(FIELDS))
if not h[1] then return {-1, ''} end
if ARGV[16] == '1' and ARGV[13] ~= '' and orphan_ended(id, ARGV[13]) == 1
    and ARGV[13] == h[2] then
  redis.call('HSET', k, 'endedAttempt', h[2])  -- a create reply still to come: nothing runs
end
if not allowed(ARGV[11], h[1]) then return {0, h[1]} end
if ARGV[15] == '1' and (h[2] ~= ARGV[13] or h[1] == 'pending') then return {2, h[1]} end
local orphaned = ''
local over = ARGV[16] == '1' and ARGV[13] == h[2]
if not over then orphaned = orphan_live(id, h, ARGV[14], now) end
if h[1] == 'pending' then
  redis.call('LREM', waitkey(h[3], h[4]), 1, id)
  redis.call('ZREM', P .. ':delayed', id)
end
unlink_inflight(id, h)
redis.call('HSET', k, 'status', to, 'updated', now, 'resultData', ARGV[6], 'error', ARGV[7])
if over then redis.call('HSET', k, 'endedAttempt', h[2]) end
note(id, now, to, h[2], h[5], ARGV[10])
redis.call('EXPIRE', k, ttl)
redis.call('EXPIRE', tlkey(id), ttl)
redis.call('LPUSH', P .. ':recent', id)
redis.call('LTRIM', P .. ':recent', 0, 999)
redis.call('HINCRBY', P .. ':finished', h[5] or '', 1)
if h[8] == '1' and ARGV[12] ~= '1' then
  redis.call('XADD', P .. ':outbox:' .. h[7], 'MINID', '~', ARGV[9], '*',
    'taskId', id, 'status', to, 'body', ARGV[8])
  redis.call('ZADD', P .. ':outboxes', now, h[7])  -- for the retention sweep (outbox.py)
  redis.call('PUBLISH', P .. ':events', 'outbox:' .. h[7])
end
-- A slot is free: wake the dispatchers when tasks wait for it. Bridge slots are shared
-- by every AIGC project, so freeing one always wakes them.
if h[1] ~= 'pending' and (h[5] == 'bridge' or redis.call('LLEN', waitkey(h[3], h[4])) > 0) then
  redis.call('PUBLISH', P .. ':events', 'wake')
end
-- the labels of the task's metrics: AIGC, platform, target, created
return {1, to, h[3], h[4], h[5], redis.call('HGET', k, 'created'), orphaned}
