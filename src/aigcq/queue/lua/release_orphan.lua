-- The platform says an unwanted remote task ended: it leaves its account's cap. With
-- ``result_json``, the success the platform reported for it: kept on its task if that
-- ended failed or cancelled meanwhile (a replay delivers it). Returns 1, or 0 when it was
-- not an orphan.
--! no move: it drops an orphan's record (a remote task we no longer want) and may keep its result on its task, not a task's state
--! arg remote_id
--! arg result_json   '' = no result (it failed, was not found, or has files to store)
--! arg now
if result_json ~= '' then
  local o = redis.call('HMGET', P .. ':orphan:' .. remote_id, 'taskId', 'attempt', 'target')
  local status = o[1] and redis.call('HGET', tkey(o[1]), 'status')
  if status == FAILED or status == CANCELLED then
    keep_paid_result(o[1], result_json, o[3], o[2], now)
  end
end
return unorphan(remote_id)
