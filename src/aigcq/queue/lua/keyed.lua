-- Waiting work kept by key (issue 37) from the queues an aigcq before it wrote as LISTs:
-- every queue ``{P}:queues`` names (or those given) is moved once (``ensure_keyed``; a queue moved already
-- costs one TYPE and a ZSCORE per ready key). Run by each dispatch loop as it starts, before its first round, so the
-- tasks that waited across the upgrade are dispatched; it completes each queue's users
-- index from its ready keys too (``ensure_users``: an aigcq that kept work by key before
-- the index wrote none). Returns how many queues it moved.
--! no move: it moves waiting tasks between layouts, their state unchanged
--! arg queues   a JSON list of "AIGC:platform" to move ('[]': every one ``{P}:queues`` names)
local named = cjson.decode(queues)
if #named == 0 then named = redis.call('SMEMBERS', P .. ':queues') end
local moved = 0
for _, queue in ipairs(named) do
  local aigc, platform = string.match(queue, '^(.*):([^:]*)$')
  if redis.call('TYPE', waitkey(aigc, platform)).ok == 'list' then
    ensure_keyed(aigc, platform)
    moved = moved + 1
  end
  ensure_users(aigc, platform)
end
return moved
