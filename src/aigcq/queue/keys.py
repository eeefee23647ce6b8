"""The Redis key layout (seed 001 §5, extended). Python builds every key name here.

Lua scripts that must find a key from what they read (a task's wait list and running set
from its hash, the bridges a ``bridgesof`` hash names) derive it from the same patterns, in
``queue/lua/_prelude.lua`` for the task scripts and in the TASK_END count of
:mod:`aigcq.bridges.registry`. So aigcq targets a standalone Redis or Sentinel, not Redis
Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass


def outbox_minid(now: float, retention_s: float) -> int:
    """The first outbox stream id kept (``MINID``, milliseconds): entries older than
    ``retention_s`` go, whether trimmed by a new message or by the retention sweep."""
    return int((now - retention_s) * 1000)


_TASKS = ":tasks"  # a bridge's tasks hash: its record's key and this


@dataclass(frozen=True, slots=True)
class _Fixed:
    """A key that takes no argument, ``{prefix}:<suffix>``, read as an attribute of
    :class:`Keys`."""

    suffix: str

    def __get__(self, keys: Keys, owner: type[Keys]) -> str:
        return f"{keys.prefix}:{self.suffix}"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def timeline(self, task_id: str) -> str:
        return f"{self.prefix}:timeline:{task_id}"

    def wait(self, aigc: str, platform: str) -> str:
        """Seed 001 §5.1: ``{prefix}:{AIGC}:{platform}:wait``, the queue's waiting task ids,
        a ZSET by rank (submitted less its priority credit; WQtasks is its ZCARD). Its keys
        (one end user's tasks of one workflow) and the ready ones are kept beside it by the
        Lua scripts (``_prelude.lua``: ``bykey``, ``keysof``, ``readyof``)."""
        return f"{self.prefix}:{aigc}:{platform}:wait"

    def running(self, aigc: str, target: str) -> str:
        """Tasks in flight on one target for one AIGC project (ZSET id -> deadline)."""
        return f"{self.prefix}:running:{aigc}:{target}"

    def orphans(self, aigc: str, target: str) -> str:
        """Remote tasks we no longer want that may still run on one account (ZSET remote
        id -> next check): they count against its cap until the platform says they ended."""
        return f"{self.prefix}:orphans:{aigc}:{target}"

    def orphan(self, remote_id: str) -> str:
        """HASH: which task and attempt an orphan ran for, and where. ``remote_id`` is
        ``create:<createId>`` (with ``createAt``) for a create with no remote id yet. The
        task's hash names each attempt's orphan (``orphan.<attempt>``)."""
        return f"{self.prefix}:orphan:{remote_id}"

    #: Every task in flight, scored by its deadline (the sweeper's index).
    inflight = _Fixed("inflight")
    #: Pending tasks backing off (ZSET id -> time they may be dispatched again).
    delayed = _Fixed("delayed")
    #: The last 1000 tasks to finish, newest first.
    recent = _Fixed("recent")
    #: Tasks finished so far, per target (HASH target -> count; "" = never dispatched).
    finished = _Fixed("finished")
    #: Free bridge slots per aigcq process (HASH process id -> "<free> <bridges> <ms>").
    internal_free = _Fixed("internal:free")
    #: What each aigcq process's bridges can run (HASH process id -> JSON, see
    #: :mod:`aigcq.bridges.peer_offers`).
    internal_offers = _Fixed("internal:offers")
    #: Set of ``AIGC:platform`` pairs that have ever had a wait queue.
    queues = _Fixed("queues")
    #: What an operator paused (HASH ``kind:name`` -> JSON since / note; see
    #: :mod:`aigcq.scheduler.pauses`).
    pauses = _Fixed("pauses")
    #: Tasks that ended failed or cancelled, while retained (ZSET id -> when they ended):
    #: where a replay by filter looks.
    replayable = _Fixed("replayable")
    #: Waiting tasks with a start deadline that expire past it (ZSET id -> start deadline,
    #: epoch s; no ``keepWaiting`` ones): the sweeper's index of ``TaskExpired``.
    startby = _Fixed("startby")
    #: Tasks with a billed run's charge due (ZSET id -> when the first became due): the
    #: sweep's index of charges a process did not make after the end that billed them.
    dues = _Fixed("dues")
    #: Each workflow's recent mean run time on our GPUs (HASH workflowId -> "<mean s>
    #: <runs>", :func:`aigcq.scheduler.policy.next_mean`), written as a task succeeds.
    runs = _Fixed("runs")

    def usage(self, aigc: str, user: str | None = None) -> str:
        """A project's (or one of its users') recent GPU-seconds, "<value> <at>" (decayed
        from ``at``, epoch s; ``_prelude.lua`` ``use_gpu``), expiring when long unused."""
        if user is None:
            return f"{self.prefix}:usage:{aigc}"
        return f"{self.prefix}:usage:{aigc}:user:{user}"

    def callback(self, remote_id: str) -> str:
        """Seed 001 §5.3: ``{prefix}:callback:{remoteTaskId}`` -> taskId."""
        return f"{self.prefix}:callback:{remote_id}"

    def polling(self, aigc: str, platform: str) -> str:
        """Seed 001 §5.1: ``{prefix}:processPolling:{AIGC}:{platform}`` remoteId -> taskId."""
        return f"{self.prefix}:processPolling:{aigc}:{platform}"

    def outbox(self, backend_id: str) -> str:
        return f"{self.prefix}:outbox:{backend_id}"

    #: Every client with an outbox stream (ZSET backendId -> time of its last message).
    outboxes = _Fixed("outboxes")
    #: HASH backendId -> connId of clients connected with ``progress=1`` (anywhere).
    progress = _Fixed("progress")

    def online(self, backend_id: str) -> str:
        """Set while a client is connected (anywhere), to its connId, with a short TTL its
        process keeps renewing (:mod:`aigcq.delivery.presence`)."""
        return f"{self.prefix}:online:{backend_id}"

    def custody_file(self, name: str) -> str:
        """A copied result file's URL in a storage serve does not read itself (S3, the OSS
        service), for its signed link to redirect to (:mod:`aigcq.delivery.custody`)."""
        return f"{self.prefix}:custody:{name}"

    def quota(self, backend_id: str) -> str:
        return f"{self.prefix}:quota:{backend_id}"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"

    def silence_asked(self, task_id: str) -> str:
        """Set (with the silence as TTL) by the process that asks about a silent paid task:
        one process asks per silence, whichever serves."""
        return f"{self.prefix}:silent:{task_id}"

    def poll_lock(self, platform: str) -> str:
        """Held by the one process polling ``platform`` this round (a short lock)."""
        return self.lock(f"poll:{platform}")

    def workflow(self, workflow_id: str) -> str:
        return f"{self.prefix}:workflow:{workflow_id}"

    def spend(self, period: str, name: str) -> str:
        """HASH: what paid tasks cost in one ``period`` (``day`` / ``month``) named ``name``
        (``2026-12-02`` / ``2026-12``, UTC), by project, account and workflow
        (:mod:`aigcq.scheduler.spend`)."""
        return f"{self.prefix}:spend:{period}:{name}"

    def paid_account(self, target: str, account: str) -> str:
        """HASH: what the last reconciliation learnt of one paid account (``account``: its
        key's digest): the platform's count and ours, the drift and since when, its
        ``remainCoins`` (what a balance floor reads), the suspect tasks
        (:mod:`aigcq.scheduler.accounts`)."""
        return f"{self.prefix}:account:{target}:{account}"

    #: Held for one interval by the process that reconciles the paid accounts then.
    reconcile_lease = _Fixed("lock:reconcile")

    #: Pub/sub channel: ``wake`` (work to dispatch) and ``outbox:<backendId>``.
    events = _Fixed("events")

    def bridge(self, bridge_id: str) -> str:
        """HASH: a bridge's shared record (capacity, rotation, failure count); ``"*"``
        matches every bridge's record and its tasks hash."""
        return f"{self.prefix}:bridge:{bridge_id}"

    def bridge_tasks(self, bridge_id: str) -> str:
        """HASH taskId -> attempt: the acknowledged tasks a bridge holds."""
        return f"{self.bridge(bridge_id)}{_TASKS}"

    @staticmethod
    def is_bridge_tasks(key: str) -> bool:
        """Whether ``key``, one ``bridge("*")`` matches, is a tasks hash, not a record."""
        return key.endswith(_TASKS)

    def bridges_of(self, task_id: str) -> str:
        """HASH bridgeId -> attempt: the bridges that acknowledged an attempt of the task
        (two while a superseded attempt runs on one), so any process that hears of the
        task's end can count it and tell each bridge's process to free its slot."""
        return f"{self.prefix}:bridgesof:{task_id}"

    #: The message-dispatcher's mirrors of its cache queue (seed 000 ``md:cache:*``),
    #: written by :mod:`aigcq.dispatcher.cache`: pending, processing and completed.
    cache_pending = _Fixed("cache:pending")
    cache_processing = _Fixed("cache:processing")
    cache_completed = _Fixed("cache:completed")


#: The message-dispatcher's state under the seed's own names (seed 000 ``md:state:*``, no
#: project prefix), written by :mod:`aigcq.health`.
MD_STATE_CONNECTION = "md:state:connection"
MD_STATE_CAPACITY = "md:state:capacity"
MD_STATE_HEARTBEAT = "md:state:last_heartbeat"
MD_STATE_HEALTH = "md:state:health"
#: seed 000 §8.3: every instance (HASH id -> its JSON), each also as ``:{instanceId}``
MD_STATE_INSTANCES = "md:state:instances"
