-- Whether a paid budget ``gate`` names is reached now (the prelude's budget_reached, as
-- begin_create.lua checks it): what is reached, or ''. An automatic budget hold is
-- lifted once this says '' for it (a new day or month, a raised limit, a balance above
-- its floor).
--! no move: it reads spend and balance, it writes nothing
--! arg gate
return budget_reached(gate)
