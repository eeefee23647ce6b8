"""The platform adapter interface (seed 000 §3.2.1's method set), kept free of I/O.

An adapter only *builds* requests and *parses* responses; :mod:`aigcq.platforms.client`
performs the HTTP calls. That keeps every adapter a pure, unit-testable module; its module also
registers what else the platform is (:mod:`aigcq.platforms.registry`).

seed name            -> here
getGenerateUrl/Header/Body -> submit_request
getSuccessTasks      -> parse_submit
getTaskResult        -> parse_result (callback body) / parse_query (polling answer)
getQueryUrl          -> query_request
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from aigcq.domain import Task


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    #: the body exactly as sent, when it must be byte-exact (a signature covers it);
    #: takes precedence over ``json``
    body: bytes | None = None


# ---- what a submit can lead to -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    """The platform took the task; its result will come by callback or polling."""

    remote_id: str


@dataclass(frozen=True, slots=True)
class Full:
    """The platform is at capacity (RunningHub 421/415/1520): wait and try again later."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The platform refused the task. ``retryable`` errors are retried, others fail it."""

    code: str
    message: str
    retryable: bool = False
    detail: Any = None


@dataclass(frozen=True, slots=True)
class Uncertain:
    """The request may or may not have created the task (e.g. a read timeout).

    It is never re-sent blindly (it may already be billed): the task waits for its webhook
    or its deadline, whichever comes first; then the platform is asked where it can answer,
    else the task fails with ``UncertainSubmit`` (unless the account has ``retry_uncertain``).
    """

    reason: str


@dataclass(frozen=True, slots=True)
class NotSent:
    """The request provably never left (no free connection in time, connect or DNS
    error, the task moved on before it was sent): nothing can have been created."""

    reason: str


SubmitOutcome = Accepted | Full | Rejected | Uncertain | NotSent


# ---- what a result (callback body or query answer) can say ----------------------------


@dataclass(frozen=True, slots=True)
class Pending:
    status: str = "RUNNING"


@dataclass(frozen=True, slots=True)
class ResultFile:
    """A result file the platform sent inline (e.g. base64) rather than as a URL."""

    name: str
    data: bytes
    content_type: str = "image/png"


@dataclass(frozen=True, slots=True)
class Cost:
    """What a task's run cost, as its platform's answer says (None: not reported).

    ``money``: in the account's currency (RunningHub's ``consumeMoney`` plus
    ``thirdPartyConsumeMoney``); ``coins``: RunningHub's ``consumeCoins``; ``seconds``: the
    run time reported (``taskCostTime``); ``tokens``: Coze's ``usage.token_count``;
    ``units``: what a configured price per unit (``AIGCQ_OVERFLOW_PRICE``) is multiplied by
    where no money is reported: 1 per task, JimuAI's output images."""

    money: float | None = None
    coins: float | None = None
    seconds: float | None = None
    tokens: int | None = None
    units: int = 1


@dataclass(frozen=True, slots=True)
class Succeeded:
    """Finished; ``data`` is what the client receives as the task's result.

    ``files`` are inline result files: :class:`aigcq.platforms.client.PlatformClient`
    stores them and appends ``{"fileUrl", "fileType"}`` entries for them to ``data`` (a
    list, or the list under ``data["data"]``) before anyone settles the task.
    """

    data: Any
    files: tuple[ResultFile, ...] = ()
    cost: Cost = Cost()


@dataclass(frozen=True, slots=True)
class Failed:
    """The task failed there. ``retryable``: the platform documents this failure as worth
    another attempt (JimuAI's output reviews): retried while the task's attempts last."""

    code: str
    message: str
    detail: Any = None
    retryable: bool = False
    cost: Cost = Cost()


@dataclass(frozen=True, slots=True)
class NotFound:
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unknown:
    """The platform gave no usable answer (unreachable, HTTP 5xx, not JSON, a code we do
    not know): ask again later. Never read as "pending" or "gone": only a definite
    failure or "not found" frees a retry of a paid task."""

    reason: str = ""


ResultOutcome = Pending | Succeeded | Failed | NotFound | Unknown


@dataclass(frozen=True, slots=True)
class AccountState:
    """What a platform says of an account now: its ``tasks`` running or queued, and its
    balance where it tells one (RunningHub's ``remainCoins``)."""

    tasks: int
    remain_coins: float | None = None


Kind = Literal["callback", "polling"]


class PlatformAdapter(ABC):
    """One external (or internal) target. Subclasses set ``name``, ``kind`` and ``serves``."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    #: task platforms (the client's ``platform`` field) this target can run.
    serves: ClassVar[tuple[str, ...]]
    #: each task costs money: an unanswered status query is asked again rather than the
    #: task run a second time elsewhere (False: our own GPUs behind the target)
    paid: ClassVar[bool] = True
    #: built only where its base URL is configured (``AIGCQ_PLATFORM_URLS``); then it is
    #: the target of the task platforms it serves, before the built-in one (comfy_v2)
    opt_in: ClassVar[bool] = False
    #: a create sent again for the same attempt can never make a second remote task (a
    #: single-use idempotency key per attempt): one whose answer was lost is sent once
    #: more at once, and only an acceptance is believed (comfy_v2)
    resend_same_attempt: ClassVar[bool] = False

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    @abstractmethod
    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> HttpRequest: ...

    @abstractmethod
    def parse_submit(self, status: int, body: Any) -> SubmitOutcome: ...

    def parse_result(self, body: Any) -> ResultOutcome:
        """Parse a callback (webhook) body. Polling platforms need not override this."""
        raise NotImplementedError(f"{self.name} does not receive callbacks")

    @abstractmethod
    def query_request(self, task: Task, apikey: str) -> HttpRequest: ...

    @abstractmethod
    def parse_query(self, status: int, body: Any) -> ResultOutcome: ...

    def cancel_request(self, task: Task, apikey: str) -> HttpRequest | None:
        return None

    def lookup_request(self, task: Task, apikey: str) -> HttpRequest | None:
        """A search for the remote task a create of ``task``'s attempt made, by what the
        create labelled it with (None: the platform has none)."""
        return None

    def parse_lookup(self, status: int, body: Any) -> str | None:
        """The answer to :meth:`lookup_request`: the one remote task found, else None."""
        return None

    def unsendable(self, task: Task) -> str | None:
        """Why ``task`` cannot be sent here at all (None: it can): nothing is sent, it waits
        for our GPUs or fails (comfy_v2: a task with no inline graph)."""
        return None

    def account_id(self, apikey: str) -> str:
        """The account ``apikey`` is, as spend records name it, without its secret: a
        digest (several AIGC projects may share one key)."""
        return hashlib.sha256(apikey.encode()).hexdigest()[:12]

    def workflow_of(self, workflow_id: str, apikey: str) -> str:
        """The workflow or model a task naming ``workflow_id`` (its payload's, maybe "")
        runs under ``apikey``, as spend records name it."""
        return workflow_id

    def billed_units(self, task: Task, apikey: str) -> int:
        """The most units a create of ``task`` may be billed for; its platform's configured
        price (``AIGCQ_OVERFLOW_PRICE``) is per unit. One per task, unless the platform
        bills per output (JimuAI: per image)."""
        return 1

    def running_request(self, apikey: str) -> HttpRequest | None:
        """A query of how many tasks the account runs (or queues) now; None: the platform
        has none. The one question about a create whose task id we never learnt."""
        return None

    def parse_running(self, status: int, body: Any) -> int | None:
        """The answer to :meth:`running_request`; None: no usable answer."""
        return None

    def parse_account(self, status: int, body: Any) -> AccountState | None:
        """The answer to :meth:`running_request` as the account's state; None: no usable
        answer."""
        tasks = self.parse_running(status, body)
        return None if tasks is None else AccountState(tasks)
