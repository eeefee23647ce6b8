"""model-asynch (seed 003): an async middleware for HTTP model services on PostgreSQL + Redis.

Business services register model services, create tasks that get a ``task_id`` at once, and
later collect results uploaded to storage. See ``docs/asynch.md``.
"""
