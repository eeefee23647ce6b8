-- The platform says an unwanted remote task ended: it leaves its account's cap. Returns
-- 1, or 0 when it was not an orphan.
--! no move: it drops an orphan's record (a remote task we no longer want), not a task's state
--! arg remote_id
return unorphan(remote_id)
