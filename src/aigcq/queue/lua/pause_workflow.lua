-- Pause (``about``: the pause's JSON) or resume (``about`` empty) a workflow and, in the
-- same step, index its keys in every queue again: out of the ready keys while it is
-- paused, back in when not. One script, so no crash can leave a paused workflow's tasks
-- ready nor a resumed one's held. Costs the queues' keys with waiting work, once per
-- change. Returns 1 if the pause changed, else 0 (and then touches nothing).
--! no move: it writes no task state, only the pause and the ready index
--! arg workflow
--! arg about
local field = 'workflow:' .. workflow
local changed
if about ~= '' then
  changed = redis.call('HSETNX', P .. ':pauses', field, about)
else
  changed = redis.call('HDEL', P .. ':pauses', field)
end
if changed == 0 then return 0 end
for _, queue in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
  local aigc, platform = string.match(queue, '^(.*):([^:]*)$')
  for _, key in ipairs(redis.call('ZRANGE', keysof(aigc, platform), 0, -1)) do
    if cjson.decode(key)[2] == workflow then
      reindex(aigc, platform, key, workflow)
    end
  end
end
return 1
