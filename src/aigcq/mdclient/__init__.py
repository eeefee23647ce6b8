"""``aigcq serve`` as a client of a message-dispatcher (seed 000's split topology): the
dispatcher as the internal target, its capacity feed, its settings and config file."""
