-- The platform says an unwanted remote task ended: it leaves its account's cap.
-- ARGV: prefix, remoteId. Returns 1, or 0 when it was not an orphan.
return unorphan(ARGV[2])
