module aigcq.test/asynchgo

go 1.19
