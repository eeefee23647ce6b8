-- A workflow was paused or resumed (aigcq.scheduler.pauses writes the pause first): index
-- its keys in every queue again, out of the ready keys while it is paused, back in when
-- not. Costs the queues' keys with waiting work, once per pause or resume. Returns how
-- many keys it looked at.
--! no move: it writes no task state, only the ready index
--! arg workflow
local seen = 0
for _, queue in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
  local aigc, platform = string.match(queue, '^(.*):([^:]*)$')
  for _, key in ipairs(redis.call('ZRANGE', keysof(aigc, platform), 0, -1)) do
    if cjson.decode(key)[2] == workflow then
      reindex(aigc, platform, key, workflow)
      seen = seen + 1
    end
  end
end
return seen
