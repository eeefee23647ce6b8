-- The platform says an unwanted remote task ended: it leaves its account's cap. With
-- ``result_json``, the success the platform reported for it (its webhook, or a check of
-- the orphan). That success wins (``late_success``) when its task failed ``late_class``
-- (UncertainSubmit: the create's outcome was unknown at the deadline) and the orphan is
-- that very attempt's paid run, still counted: the task ends a success, and its client is
-- sent the result after the failure, marked ``late``. Otherwise it is kept on its task if
-- that ended failed or cancelled meanwhile (a replay delivers it).
-- With ``cost`` (what the platform says the run cost), the released run's charge is due
-- in the same step: on its task when its success won, else as a run it no longer wanted.
-- Returns {1, '', '', ''} (released), {0, '', '', ''} (not an orphan), or
-- {2, AIGC, platform, target} (released, and the late success won).
--! move late_success
--! arg remote_id
--! arg result_json   '' = no result (it failed, was not found, or has files to store)
--! arg now
--! arg late_class    the failure a late success of the same attempt overrides (its code)
--! arg minid         the outbox's MINID (ms)
--! arg cost          JSON ('' = no charge: not found, or no answer)
-- The orphan record names the task and attempt, and that attempt's field on the task
-- names the orphan: only then is it the run the failure gave up on.
local function wins(o, k)
  local h = redis.call('HMGET', k, 'status', 'attempt', 'orphan.' .. (o[2] or ''))
  return allowed(FROM.late_success, h[1]) and h[2] == o[2] and h[3] == remote_id
    and failed_as(k, late_class)
end
local function late_success(id, k, o)
  local h = redis.call('HMGET', k, unpack(FIELDS))
  redis.call('HSET', k, 'status', TO.late_success, 'updated', now, 'resultData', result_json,
    'failedFirst', redis.call('HGET', k, 'error') or '', 'error', 'null',
    'endedAttempt', o[2], 'lateSuccessAt', now)
  redis.call('HDEL', k, 'paidResult', 'paidResultFrom', 'paidResultAt')
  note(id, now, TO.late_success, o[2], o[3], 'late success of ' .. remote_id)
  redis.call('ZREM', P .. ':replayable', id)
  redis.call('LREM', P .. ':recent', 0, id)
  redis.call('LPUSH', P .. ':recent', id)
  if h[8] == '1' then
    redis.call('XADD', P .. ':outbox:' .. h[7], 'MINID', '~', minid, '*', 'taskId', id,
      'status', TO.late_success, 'body', '{"result":' .. result_json .. ',"late":true}',
      'attempt', o[2])
    redis.call('ZADD', P .. ':outboxes', now, h[7])
    redis.call('PUBLISH', P .. ':events', 'outbox:' .. h[7])
  end
  return {h[3], h[4], h[5]}
end
local labels = nil
local o = redis.call('HMGET', P .. ':orphan:' .. remote_id, 'taskId', 'attempt', 'target')
if result_json ~= '' then
  local k = o[1] and tkey(o[1])
  local status = k and redis.call('HGET', k, 'status')
  if status and wins(o, k) then
    labels = late_success(o[1], k, o)
  elseif status == FAILED or status == CANCELLED then
    keep_paid_result(o[1], result_json, o[3], o[2], now)
  end
end
local released = unorphan(remote_id)
if released == 1 and o[1] then charge_due(o[1], o[2] or '', o[3] or '', cost, labels ~= nil, now) end
if labels then return {2, labels[1], labels[2], labels[3]} end
return {released, '', '', ''}
