"""aigcq-wire: the bridge protocol's messages (:mod:`.bridge`), what an instance can run
(:mod:`.capabilities`), the error codes clients see (:mod:`.errors`), signed file links
(:mod:`.links`) and the Volcengine request signature (:mod:`.volc_sign`): what the server,
the bridge and the SDK must agree on. pydantic is its only dependency."""
