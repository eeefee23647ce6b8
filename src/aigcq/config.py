"""Settings (``AIGCQ_*`` env, ``.env``, and the seed's names) and the platform files.

The platform files keep the seed's shapes:

* ``model.json``  ``{AIGC: {platform: {"apikey": ..., "concurrency": N, ...}}}``
* ``Platform.json`` ``{"callback": [...], "polling": [...]}``
* ``code.json`` ``{"ERROR": {code: message}, "SUCCESS": {code: message}}``

A file that exists but is malformed stops start-up with :class:`ConfigError`, naming the
file, the field and the problem.

Longer than 400 lines because :class:`Settings` is the one table of every setting, each
with its variable names, bounds and description (``scripts/gen_config_reference.py`` writes
docs/configuration.md from it); the platform files follow it, from :class:`ConfigError` on.
"""

from __future__ import annotations

import difflib
import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from aigcq.plumbing.http_limits import HttpLimits
from aigcq.plumbing.redis_address import (
    RedisAddressError,
    is_sentinel,
    parse_sentinel_url,
    redacted,
    sentinel_url,
)


def _env(name: str, *seed_names: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_{name}", *seed_names)


_M = TypeVar("_M", bound=BaseModel)

#: marks a platform's own base-URL setting, ``<name>_url`` (:meth:`Settings.platform_url`)
PLATFORM_URL: dict[str, Any] = {"platform_url": True}


class IdBinding(enum.StrEnum):
    """Which backendIds a client JWT may use (``AIGCQ_BIND_CLIENT_IDS``)."""

    SUB = "sub"  # a JWT naming ids (sub, ids claim) is bound to them; one naming none is not
    ALL = "all"  # every JWT is bound; one naming no id may use none
    OFF = "off"  # any valid token, any id (the original system's behaviour)

    @classmethod
    def _missing_(cls, value: object) -> IdBinding | None:
        """The former boolean values: true is ``all``, false ``off``."""
        flag = str(value).strip().lower()
        if flag in ("true", "1", "yes", "on"):
            return cls.ALL
        if flag in ("false", "0", "no"):
            return cls.OFF
        return None


class ResultCustody(enum.StrEnum):
    """Which paid results have their files copied into aigcq's storage before delivery
    (``AIGCQ_RESULT_CUSTODY``)."""

    OFF = "off"  # never: clients get the vendors' links
    OFFLINE = "offline"  # results whose client is not connected when they come
    ALWAYS = "always"  # every result of a custody target


class Settings(HttpLimits):
    """Process settings. Every field reads ``AIGCQ_<NAME>``; some also the seed's name.
    The bounds of its listening surfaces come first (:class:`HttpLimits`).

    ``AIGCQ_REDIS_SENTINELS`` with ``AIGCQ_REDIS_MASTER`` (and their credentials) set
    ``redis_url`` to their ``redis+sentinel://`` URL, so every process and worker passes one
    URL on; a malformed one, or one that contradicts ``AIGCQ_REDIS_URL``, stops start-up."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", populate_by_name=True, case_sensitive=False
    )

    project_prefix: str = Field("aigcq", validation_alias=_env("PROJECT_PREFIX", "PROJECT_PREFIX"))
    token_secret: str = Field("", validation_alias=_env("TOKEN_SECRET", "TOKEN_SECRET"))
    client_tokens: list[str] = Field(
        default_factory=list,
        validation_alias=_env("CLIENT_TOKENS"),
        description="Static client tokens accepted besides JWTs signed with TOKEN_SECRET.",
    )
    bind_client_ids: IdBinding = Field(
        IdBinding.SUB,
        validation_alias=_env("BIND_CLIENT_IDS"),
        description=(
            "sub: a client JWT naming ids (its sub, its ids claim) may only use those;"
            " all: every JWT (none naming no id); off: any id (the original system)."
        ),
    )
    admin_token: str = Field("", validation_alias=_env("ADMIN_TOKEN"))
    bridge_token: str = Field("", validation_alias=_env("BRIDGE_TOKEN"))
    metrics_token: str = Field(
        "",
        validation_alias=_env("METRICS_TOKEN"),
        description="Bearer token /metrics requires (serve, dispatcher, asynch); unset: open.",
    )
    callback_secret: str = Field(
        "",
        validation_alias=_env("CALLBACK_SECRET"),
        description="HMAC key for per-task webhook URLs; defaults to TOKEN_SECRET. `serve` "
        "refuses to start when both are unset (`up` generates TOKEN_SECRET).",
    )

    host: str = Field("127.0.0.1", validation_alias=_env("HOST"))
    ws_port: int = Field(8087, validation_alias=_env("WS_PORT", "WS_PORT"))
    callback_port: int = Field(8089, validation_alias=_env("CALLBACK_PORT", "CALLBACK_PORT"))
    bridge_port: int = Field(
        0, validation_alias=_env("BRIDGE_PORT"), description="Extra port for bridges (seed: 8080)."
    )
    workers: int = Field(
        1,
        ge=1,
        validation_alias=_env("WORKERS"),
        description="Server processes on the same ports (SO_REUSEPORT); one per core.",
    )
    reuse_port: bool = Field(
        False,
        validation_alias=_env("REUSE_PORT"),
        description="Bind with SO_REUSEPORT, so several processes share the ports.",
    )
    callback_url: str = Field(
        "",
        validation_alias=_env("CALLBACK_URL", "CALLBACK_URL"),
        description="Public base URL of this server's callback endpoint.",
    )

    redis_url: str = Field(
        "",
        validation_alias=_env("REDIS_URL", "REDIS_URL"),
        description="redis://, rediss://, unix:// or redis+sentinel://[user:password@]"
        "host:port,host:port/master[/db][?sentinel_password=...] (empty: a private Redis).",
    )
    redis_sentinels: str = Field(
        "",
        validation_alias=_env("REDIS_SENTINELS"),
        description="Sentinels host:port,host:port,...: Redis is the master they name "
        "AIGCQ_REDIS_MASTER (instead of AIGCQ_REDIS_URL; the same as its redis+sentinel:// form).",
    )
    redis_master: str = Field(
        "", validation_alias=_env("REDIS_MASTER"), description="The master's name, with sentinels."
    )
    redis_db: int = Field(0, ge=0, validation_alias=_env("REDIS_DB"), description="With sentinels.")
    redis_username: str = Field(
        "", validation_alias=_env("REDIS_USERNAME"), description="The master's, with sentinels."
    )
    redis_password: str = Field(
        "", validation_alias=_env("REDIS_PASSWORD"), description="The master's, with sentinels."
    )
    redis_sentinel_username: str = Field(
        "", validation_alias=_env("REDIS_SENTINEL_USERNAME"), description="The sentinels' own."
    )
    redis_sentinel_password: str = Field(
        "", validation_alias=_env("REDIS_SENTINEL_PASSWORD"), description="The sentinels' own."
    )
    redis_min_replicas: int = Field(
        0,
        ge=0,
        validation_alias=_env("REDIS_MIN_REPLICAS"),
        description="Replicas that must have a write (Redis WAIT) before a submit is "
        "acknowledged, a paid create is sent, or a TASK_END gets its 200 (0: no WAIT; set 1 "
        "with Sentinel, see docs/operations.md).",
    )
    redis_wait_timeout_ms: int = Field(
        500,
        gt=0,
        validation_alias=_env("REDIS_WAIT_TIMEOUT_MS"),
        description="How long one WAIT may hold the hot path for the replicas; then the "
        "write is not acknowledged (the submit gets AssessmentError, the create waits, the "
        "TASK_END 503).",
    )
    database_url: str = Field("", validation_alias=_env("DATABASE_URL"))
    asynch_url: str = Field(
        "",
        validation_alias=_env("ASYNCH_URL"),
        description="Base URL of model-asynch: the dashboard shows its /admin/overview.",
    )
    # the platforms' own URL settings (the seed's names; another platform's URL is set in
    # AIGCQ_PLATFORM_URLS): each agrees with its spec (tests/unit/test_platform_registry.py)
    runninghub_url: str = Field(
        "https://www.runninghub.cn",
        validation_alias=_env("RUNNINGHUB_URL", "RunningHub_URL", "RUNNINGHUB_URL"),
        json_schema_extra=PLATFORM_URL,
    )
    coze_url: str = Field(
        "https://api.coze.cn",
        validation_alias=_env("COZE_URL", "COZE_URL"),
        json_schema_extra=PLATFORM_URL,
    )
    jimuai_url: str = Field(
        "https://visual.volcengineapi.com",
        validation_alias=_env("JIMUAI_URL", "JIMUAI_URL"),
        description="JimuAI (即梦) = Volcengine's visual API; point at `aigcq emulate jimuai`.",
        json_schema_extra=PLATFORM_URL,
    )
    platform_urls: dict[str, str] = Field(
        default_factory=dict,
        validation_alias=_env("PLATFORM_URLS"),
        description="Base URL per platform adapter (JSON), for platforms without a field.",
    )
    message_dispatcher_url: str = Field(
        "",
        validation_alias=_env("MESSAGE_DISPATCHER_URL", "MESSAGE_DISPATCHER_URL"),
        json_schema_extra=PLATFORM_URL,
    )

    config_dir: Path = Field(Path("config"), validation_alias=_env("CONFIG_DIR"))
    data_dir: Path = Field(Path(".aigcq"), validation_alias=_env("DATA_DIR"))

    max_payload_bytes: int = Field(
        1 << 20,
        validation_alias=_env("MAX_PAYLOAD_BYTES"),
        description="Largest client message, HTTP request body and TASK_END body: a larger "
        "one is refused (PayloadTooLarge, 413) as soon as it passes the limit.",
    )
    result_retention_s: int = Field(86400, validation_alias=_env("RESULT_RETENTION_S"))
    comfy_v2_project: str = Field(
        "",
        validation_alias=_env("COMFY_V2_PROJECT"),
        description="The AIGC project whose `comfyui` queue Comfy API v2 jobs "
        "(`POST /api/v2/jobs`) join; empty: the default project (`AIGCQ_PROJECT_PREFIX`).",
    )
    comfy_v2_max_waiting: int = Field(
        0,
        ge=0,
        validation_alias=_env("COMFY_V2_MAX_WAITING"),
        description="Waiting tasks that queue may hold before `POST /api/v2/jobs` is refused "
        "`429 queue_full` with `Retry-After` (0: no limit).",
    )
    comfy_v2_max_upload_bytes: int = Field(
        100 << 20,
        gt=0,
        validation_alias=_env("COMFY_V2_MAX_UPLOAD_BYTES"),
        description="Largest file `POST /api/v2/assets` takes (a larger one is refused "
        "`413 payload_too_large` as soon as it passes the limit); ComfyUI's own default.",
    )
    outbox_retention_s: int = Field(2 * 86400, validation_alias=_env("OUTBOX_RETENTION_S"))
    result_custody: ResultCustody = Field(
        ResultCustody.OFFLINE,
        validation_alias=_env("RESULT_CUSTODY"),
        description="off | offline | always: copy the result files of RESULT_CUSTODY_TARGETS "
        "into aigcq's storage (AIGCQ_STORAGE_*) before delivering them, for results whose "
        "client is not connected (offline) or for all; the client gets a signed aigcq link "
        "and the vendor's as sourceUrl (their links expire in about a day).",
    )
    result_custody_targets: list[str] | None = Field(
        None,
        validation_alias=_env("RESULT_CUSTODY_TARGETS"),
        description="Paid targets whose result links expire (JSON list; unset: every "
        "platform whose spec says so, runninghub, jimuai and comfy_v2).",
    )
    result_custody_max_bytes: int = Field(
        100 << 20,
        gt=0,
        validation_alias=_env("RESULT_CUSTODY_MAX_BYTES"),
        description="Largest result file copied; a larger one keeps the vendor's link.",
    )
    result_custody_timeout_s: float = Field(
        30.0,
        gt=0,
        validation_alias=_env("RESULT_CUSTODY_TIMEOUT_S"),
        description="Longest the download of one result file may take; then that file keeps "
        "the vendor's link.",
    )
    result_link_ttl_s: int = Field(
        3 * 86400,
        gt=0,
        validation_alias=_env("RESULT_LINK_TTL_S"),
        description="How long a signed link to a copied result file works; the local copy "
        "is deleted after it.",
    )
    task_deadline_s: float = Field(600.0, validation_alias=_env("TASK_DEADLINE_S"))
    max_attempts: int = Field(3, validation_alias=_env("MAX_ATTEMPTS"))
    max_free_requeues: int = Field(
        1000,
        ge=0,
        validation_alias=_env("MAX_FREE_REQUEUES"),
        description="Requeues of one task that do not use an attempt (platform full, never "
        "sent, bridge lost before it ran); later ones do, so no task loops forever.",
    )
    internal_capacity_max: int = Field(
        0,
        ge=0,
        validation_alias=_env("INTERNAL_CAPACITY_MAX", "INTERNAL_CAPACITY_MAX"),
        description="Most tasks one dispatch round gives the internal target (0 = no cap).",
    )
    external_capacity_max: int = Field(
        0,
        ge=0,
        validation_alias=_env("EXTERNAL_CAPACITY_MAX", "EXTERNAL_CAPACITY_MAX"),
        description="Most tasks of one queue in flight on its external platform (0 = no cap).",
    )
    sweep_interval_s: float = Field(1.0, validation_alias=_env("SWEEP_INTERVAL_S"))
    client_send_timeout_s: float = Field(
        10.0,
        gt=0,
        validation_alias=_env("CLIENT_SEND_TIMEOUT_S"),
        description="How long a send to (or the close of) a client socket may wait on the "
        "peer; one that stopped reading is dropped and its results wait in its outbox.",
    )
    paid_silence_s: float = Field(
        60.0,
        gt=0,
        validation_alias=_env("PAID_SILENCE_S"),
        description="A paid task running this long with no webhook is asked about (its "
        "platform's status query), then again at that interval: a lost webhook does not "
        "hold its slot and its client until the deadline.",
    )
    paid_max_run_s: dict[str, float] = Field(
        default_factory=dict,
        validation_alias=_env("PAID_MAX_RUN_S"),
        description="Longest a task may run on each paid platform (JSON by target, e.g. "
        '{"runninghub": 1800}; unlisted: 3600 s): a create whose outcome stayed unknown '
        "is counted in its account's cap until the platform answers or this long after it.",
    )
    cost_currency: str = Field(
        "CNY",
        validation_alias=_env("COST_CURRENCY"),
        description="The currency of paid platforms' costs and AIGCQ_OVERFLOW_PRICE, as a "
        "paid attempt's trace span names it (aigcq.cost.currency; docs/tracing.md).",
    )
    spend_timezone: str = Field(
        "UTC",
        validation_alias=_env("SPEND_TIMEZONE"),
        description="The time zone (IANA name, e.g. Asia/Shanghai) whose days and months "
        "spend is counted in, and so when daily and monthly budgets reset.",
    )
    reconcile_interval_s: float = Field(
        30.0,
        ge=0,
        validation_alias=_env("RECONCILE_INTERVAL_S"),
        description="How often one process of the fleet asks each RunningHub account how "
        "many tasks it runs (accountStatus) and compares it with our count (0: never).",
    )
    reconcile_grace_s: float = Field(
        120.0,
        ge=0,
        validation_alias=_env("RECONCILE_GRACE_S"),
        description="How long the platform may count more tasks on an account than we do "
        "before the account takes no new create (with AIGCQ_RECONCILE_STOP).",
    )
    reconcile_stop: bool = Field(
        True,
        validation_alias=_env("RECONCILE_STOP"),
        description="Hold new creates on an account the platform counts more tasks on than "
        "we do for longer than AIGCQ_RECONCILE_GRACE_S (false: only log and show it).",
    )
    full_backoff_s: float = Field(
        2.0, validation_alias=_env("FULL_BACKOFF_S"), description="Back-off after 421/415/1520."
    )
    http_timeout_s: float = Field(
        30.0,
        validation_alias=_env("HTTP_TIMEOUT_S"),
        description="Per platform request, once sent (waiting for a free connection first "
        "is not counted: such a request has not left).",
    )
    platform_max_in_flight: int = Field(
        64,
        ge=1,
        validation_alias=_env("PLATFORM_MAX_IN_FLIGHT"),
        description="Platform HTTP requests in flight at once (the connection pool size).",
    )
    poll_interval_s: float | None = Field(
        None,
        validation_alias=_env("POLL_INTERVAL_S"),
        description="Fixed polling interval; unset = the seed's adaptive 5-30 s.",
    )
    health_interval_s: float = Field(10.0, gt=0, validation_alias=_env("HEALTH_INTERVAL_S"))
    health_recover_passes: int = Field(
        3,
        ge=1,
        validation_alias=_env("HEALTH_RECOVER_PASSES"),
        description="Passing health checks in a row that bring degraded capacity back.",
    )
    bridge_silence_s: float = Field(
        60.0, gt=0, validation_alias=_env("BRIDGE_SILENCE_S"), description="Unheard -> degraded."
    )
    overflow_after_ms: int = Field(
        0,
        ge=0,
        validation_alias=_env("OVERFLOW_AFTER_MS"),
        description="Wait this long for healthy internal capacity before paying (0 = seed).",
    )
    eta_interval_s: float = Field(
        1.0,
        gt=0,
        validation_alias=_env("ETA_INTERVAL_S"),
        description="How often each process estimates the waiting tasks' position and ETA "
        "(and sends QUEUE_UPDATE messages).",
    )
    eta_window: int = Field(
        1000,
        ge=1,
        validation_alias=_env("ETA_WINDOW"),
        description="Waiting tasks per queue the estimate lays out; tasks further back get "
        "no position or ETA (null).",
    )
    queue_update_interval_s: float = Field(
        2.0,
        ge=0,
        validation_alias=_env("QUEUE_UPDATE_INTERVAL_S"),
        description="Least time between two QUEUE_UPDATE messages about one task.",
    )
    overflow_price: dict[str, float] = Field(
        default_factory=dict,
        validation_alias=_env("OVERFLOW_PRICE"),
        description=(
            'Price per task by external target (JSON, e.g. {"runninghub": 0.1}; JimuAI: per '
            "output image): a task's cost where its platform reports no money (an estimate), "
            "and what its maxCost is checked against."
        ),
    )
    capacity_interval_s: float = Field(
        5.0,
        gt=0,
        validation_alias=_env("CAPACITY_INTERVAL_S"),
        description="How often the capacity planner decides each pool's instance count "
        "(pools.json; docs/capacity.md).",
    )
    capacity_horizon_s: float = Field(
        900.0,
        gt=0,
        validation_alias=_env("CAPACITY_HORIZON_S"),
        description="The horizon the capacity planner prices queue, rent and overflow over.",
    )
    capacity_patience_s: float = Field(
        300.0,
        ge=0,
        validation_alias=_env("CAPACITY_PATIENCE_S"),
        description="A task with no start deadline is planned as if it had to start within "
        "this (the planner rents for it rather than let it wait longer).",
    )
    capacity_miss_cost: float | None = Field(
        None,
        ge=0,
        validation_alias=_env("CAPACITY_MISS_COST"),
        description="What the planner counts a missed start deadline as costing (unset: 10x "
        "the dearest paid task, at least 1).",
    )
    scale_command: str = Field(
        "",
        validation_alias=_env("SCALE_COMMAND"),
        description="Command run (by one process of the fleet) when a pool's desired count "
        "changes or idle drained instances may stop: COMMAND POOL DESIRED [BRIDGE_ID...].",
    )
    bridge_failure_limit: int = Field(
        3, ge=1, validation_alias=_env("BRIDGE_FAILURE_LIMIT"), description="-> out of rotation."
    )
    bridge_quarantine_s: float = Field(
        60.0, ge=0, validation_alias=_env("BRIDGE_QUARANTINE_S"), description="Before re-admission."
    )
    bridge_register_timeout_s: float = Field(
        5.0,
        gt=0,
        validation_alias=_env("BRIDGE_REGISTER_TIMEOUT_S"),
        description="A bridge WebSocket that has not sent a valid REGISTER this long after "
        "it connected is closed with 4408.",
    )
    bridge_max_msgs_per_s: int = Field(
        100,
        ge=0,
        validation_alias=_env("BRIDGE_MAX_MSGS_PER_S"),
        description="Frames a second one bridge may send; more closes it with 4008 (0 = no limit).",
    )
    bridge_lookahead: int = Field(
        32,
        ge=0,
        validation_alias=_env("BRIDGE_LOOKAHEAD"),
        description="Waiting tasks looked at beyond the free slots' worth, so that tasks "
        "behind one no free instance can run are claimed ahead of it (0: only the first as "
        "many as there are free slots).",
    )
    no_capable_wait_s: float = Field(
        60.0,
        ge=0,
        validation_alias=_env("NO_CAPABLE_WAIT_S"),
        description="A task only offline instances can run waits this long for one to come "
        "back (or its queue's paid platform) before it fails NoCapableInstance.",
    )
    bridge_grace_s: float = Field(
        30.0,
        ge=0,
        validation_alias=_env("BRIDGE_GRACE_S"),
        description="A bridge that leaves (a restart) keeps what it offered, and its slots, "
        "this long on every serve process: a task only it can run waits for it rather than "
        "failing NoCapableInstance or going to a paid platform (0: not kept).",
    )

    shares: bool = Field(
        True,
        validation_alias=_env("SHARES"),
        description="Fair shares of our GPUs between projects and their end users (false: "
        "strict first come, first served by rank; docs/scheduling.md).",
    )
    #: settings that are gone, each refused at start with what replaced it
    removed_scheduler: str | None = Field(None, validation_alias=_env("SCHEDULER"), exclude=True)
    removed_share_lookahead: str | None = Field(
        None, validation_alias=_env("SHARE_LOOKAHEAD"), exclude=True
    )
    share_weights: dict[str, float] = Field(
        default_factory=dict,
        validation_alias=_env("SHARE_WEIGHTS"),
        description="each project's weight in the share of our GPUs (JSON, e.g. "
        '{"studio": 2}; unlisted: 1).',
    )
    share_half_life_s: float = Field(
        300.0,
        gt=0,
        validation_alias=_env("SHARE_HALF_LIFE_S"),
        description="recent GPU-seconds per project and user halve every this long.",
    )
    share_lend_s: float = Field(
        40.0,
        validation_alias=_env("SHARE_LEND_S"),
        description="a task about to miss its start deadline borrows another tenant's "
        "place only while its tenant's recent usage per weight is at most this many "
        "seconds of the whole pool ahead of the lender's (< 0: never borrows).",
    )
    share_patience: float = Field(
        0.3,
        ge=0,
        validation_alias=_env("SHARE_PATIENCE"),
        description="a lender waits for a borrower at most this fraction of its own maximum wait.",
    )
    share_margin: float = Field(
        0.8,
        ge=0,
        validation_alias=_env("SHARE_MARGIN"),
        description="an estimated start within this fraction of a task's maximum wait "
        "before its deadline counts as a miss (it is rescued, or goes paid).",
    )
    share_default_run_s: float = Field(
        10.0,
        gt=0,
        validation_alias=_env("SHARE_DEFAULT_RUN_S"),
        description="the run time assumed for a workflow none of our GPUs ran yet (and "
        "no other workflow either).",
    )
    user_max_running: int = Field(
        0,
        ge=0,
        validation_alias=_env("USER_MAX_RUNNING"),
        description="most tasks of one userId of a project on our GPUs at once, every "
        "process together (0 = no limit).",
    )
    priority_max_s: dict[str, float] = Field(
        default_factory=lambda: {"*": 300.0},
        validation_alias=_env("PRIORITY_MAX_S"),
        description="Largest priority (seconds of credit) a task may carry, by project (JSON; "
        '"*": every other project; 0 or unlisted without "*": none allowed).',
    )
    max_wait_ms: dict[str, int] = Field(
        default_factory=dict,
        validation_alias=_env("MAX_WAIT_MS"),
        description="Start deadline of a task that carries no maxWaitMs, by project (JSON, "
        'e.g. {"*": 600000}; unlisted: none).',
    )

    admission: str = Field(
        "none", validation_alias=_env("ADMISSION"), description="none | quota | billing"
    )
    admission_quota: int = Field(
        0,
        validation_alias=_env("ADMISSION_QUOTA"),
        description="Starting task quota of each principal (a token's sub).",
    )
    billing_url: str = Field("", validation_alias=_env("BILLING_URL"))

    def platform_url(self, name: str) -> str:
        """Platform ``name``'s base URL: its ``AIGCQ_PLATFORM_URLS`` entry, else its own
        ``<name>_url`` setting's ("": neither)."""
        own = type(self).model_fields.get(f"{name}_url")
        setting = (
            getattr(self, f"{name}_url") if own and own.json_schema_extra == PLATFORM_URL else ""
        )
        return self.platform_urls.get(name) or str(setting)

    @model_validator(mode="after")
    def _removed(self) -> Settings:
        """A setting that is gone is refused, naming what replaced it."""
        if self.removed_scheduler is not None:
            raise ValueError(
                "AIGCQ_SCHEDULER is gone: there is one scheduler, fair by default "
                "(AIGCQ_SHARES=false for strict first come, first served); unset it"
            )
        if self.removed_share_lookahead is not None:
            raise ValueError(
                "AIGCQ_SHARE_LOOKAHEAD is gone: a round reads every ready key, at any depth; "
                "unset it"
            )
        return self

    @model_validator(mode="after")
    def _spend_zone(self) -> Settings:
        """AIGCQ_SPEND_TIMEZONE names a zone this host knows."""
        try:
            ZoneInfo(self.spend_timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"AIGCQ_SPEND_TIMEZONE: no time zone {self.spend_timezone!r}") from exc
        return self

    @model_validator(mode="after")
    def _redis_address(self) -> Settings:
        """The Sentinel settings as ``redis_url``; a Sentinel URL checked now, not at the
        first command."""
        if self.redis_sentinels or self.redis_master:
            try:
                url = sentinel_url(
                    self.redis_sentinels,
                    self.redis_master,
                    db=self.redis_db,
                    username=self.redis_username,
                    password=self.redis_password,
                    sentinel_username=self.redis_sentinel_username,
                    sentinel_password=self.redis_sentinel_password,
                )
            except RedisAddressError as exc:
                raise ValueError(f"AIGCQ_REDIS_SENTINELS / AIGCQ_REDIS_MASTER: {exc}") from exc
            if self.redis_url and self.redis_url != url:
                raise ValueError(
                    "AIGCQ_REDIS_URL and AIGCQ_REDIS_SENTINELS/AIGCQ_REDIS_MASTER are both set"
                    f" and differ ({redacted(self.redis_url)} vs {redacted(url)}): set one"
                )
            self.redis_url = url
        if is_sentinel(self.redis_url):
            try:
                parse_sentinel_url(self.redis_url)
            except RedisAddressError as exc:
                raise ValueError(f"AIGCQ_REDIS_URL: {exc}") from exc
        return self

    @property
    def secrets_file(self) -> Path:
        """Where ``aigcq up`` keeps the secrets it generated (token secret, admin and bridge
        tokens): ``<data_dir>/secrets.json``."""
        return self.data_dir / "secrets.json"

    def stored_secrets(self) -> dict[str, str]:
        """The contents of :attr:`secrets_file` (empty when there is none)."""
        path = self.secrets_file
        data: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        return data

    def priority_max(self, aigc: str) -> float:
        """The largest priority credit a task of project ``aigc`` may carry (s)."""
        return self.priority_max_s.get(aigc, self.priority_max_s.get("*", 0.0))

    def default_max_wait_s(self, aigc: str) -> float | None:
        """The start deadline of a task of ``aigc`` that carries no ``maxWaitMs`` (s)."""
        ms = self.max_wait_ms.get(aigc, self.max_wait_ms.get("*"))
        return None if ms is None else ms / 1000

    def public_callback_base(self) -> str:
        return (self.callback_url or f"http://{self.host}:{self.callback_port}").rstrip("/")

    def signing_key(self) -> bytes:
        """The HMAC key of webhook URLs: CALLBACK_SECRET, else TOKEN_SECRET. Empty when
        neither is set: ``serve`` then refuses to start, and nothing signs or verifies with
        it (:mod:`aigcq.plumbing.signing`)."""
        return (self.callback_secret or self.token_secret).encode()


NO_SIGNING_KEY = (
    "no AIGCQ_CALLBACK_SECRET and no AIGCQ_TOKEN_SECRET: webhook URLs cannot be signed "
    "(set one; `aigcq up` generates TOKEN_SECRET)"
)


class ConfigError(Exception):
    """A configuration file is unreadable or invalid; the message names file and field."""


class AccountBudget(BaseModel):
    """An account's ``budget`` in model.json: daily and monthly spend limits (in the
    spend's amount: the platform's money, else the configured price) and a balance floor
    (RunningHub's ``remainCoins``, as last polled). Unset: no limit."""

    model_config = ConfigDict(extra="forbid")

    day: float | None = Field(None, ge=0)
    month: float | None = Field(None, ge=0)
    balance_floor: float | None = Field(None, ge=0)


class ProjectBudget(BaseModel):
    """A project's ``budget`` in model.json (beside its platforms): daily and monthly
    spend limits over all its paid platforms, and what its tasks do at a limit: ``wait``
    for internal capacity, or ``fail`` with ``BudgetExceeded``."""

    model_config = ConfigDict(extra="forbid")

    day: float | None = Field(None, ge=0)
    month: float | None = Field(None, ge=0)
    on_limit: Literal["wait", "fail"] = "wait"


#: the key of a project's budget in model.json, beside its platforms
BUDGET_KEY = "budget"


class ProjectShare(BaseModel):
    """A project's ``share`` of our GPUs in model.json (beside its platforms and
    ``budget``; docs/scheduling.md): ``min`` GPUs it gets whenever it has work that can
    run, ``max`` it never exceeds (None: no ceiling), and its ``weight`` in the rest (it
    overrides ``AIGCQ_SHARE_WEIGHTS``)."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(0, ge=0)
    max: int | None = Field(None, ge=1)
    weight: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _burst_above_min(self) -> ProjectShare:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


#: the key of a project's share of our GPUs in model.json, beside its platforms
SHARE_KEY = "share"


class PlatformAccount(BaseModel):
    """One entry of model.json: the credentials and limits of a platform for one AIGC.
    An unknown key is refused (the seed's entries carry only ``apikey`` and
    ``concurrency``): a typo such as ``concurency`` must not start with the default."""

    model_config = ConfigDict(extra="forbid")

    apikey: str = ""
    concurrency: int = Field(1, ge=0)
    deadline_s: float | None = Field(None, gt=0)
    max_attempts: int | None = Field(None, ge=1)
    #: a create whose outcome stayed unknown until the deadline is sent again (it may be
    #: paid twice) instead of failing the task with ``UncertainSubmit``
    retry_uncertain: bool = False
    #: the account's spend limits and balance floor (:mod:`aigcq.scheduler.budgets`)
    budget: AccountBudget | None = None


class JimuAIAccount(PlatformAccount):
    """model.json's ``jimuai`` entry: Volcengine AK/SK instead of an apikey.

    The four values are packed (as JSON) into ``apikey``, the one credential the platform
    adapters are handed (:class:`aigcq.platforms.jimuai.JimuCredentials` reads it back).
    Neither key shows in the account's repr.
    """

    apikey: str = Field("", repr=False)
    access_key: str = Field(min_length=1)
    secret_key: str = Field(min_length=1, repr=False)
    region: str = "cn-north-1"
    req_key: str = Field("", description="Model used when a payload names no req_key.")
    #: the most output images (each one billed) a task of the project may have: a create
    #: that may make more is sent with the API's single-output flag (None: the vendor's 15)
    max_outputs: int | None = Field(None, ge=1, le=15)

    @model_validator(mode="after")
    def _pack(self) -> JimuAIAccount:
        self.apikey = json.dumps(
            {
                "access_key": self.access_key,
                "secret_key": self.secret_key,
                "region": self.region,
                "req_key": self.req_key,
                "max_outputs": self.max_outputs,
            },
            separators=(",", ":"),
        )
        return self


#: model.json entries whose platform needs more than an apikey
ACCOUNT_MODELS: dict[str, type[PlatformAccount]] = {"jimuai": JimuAIAccount}


class PlatformKinds(BaseModel):
    """Platform.json: which platforms report by callback and which are polled."""

    model_config = ConfigDict(extra="forbid")

    callback: list[str] = Field(default_factory=lambda: ["comfyui", "runninghub"])
    polling: list[str] = Field(default_factory=lambda: ["coze", "jimuai"])


#: seconds in each billing step a rentable pool may be billed by
BILLING_STEP_S: dict[str, int] = {"second": 1, "minute": 60, "hour": 3600}


class PoolConfig(BaseModel):
    """One pool of GPU instances in ``pools.json`` (beside model.json; docs/capacity.md):
    what an instance offers (``node_classes`` and ``models``; empty: anything), its
    ``price_per_hour`` billed by ``billing_step``, the ``boot_s`` from start to a
    registered bridge, and ``min`` / ``max`` instances. Owned machines are a pool with
    price 0 and a fixed size (``min`` = ``max``). A bridge belongs to the pool whose
    ``bridges`` pattern (fnmatch; default ``<pool>-*``) its bridgeId matches."""

    model_config = ConfigDict(extra="forbid")

    node_classes: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    price_per_hour: float = Field(0.0, ge=0)
    billing_step: Literal["second", "minute", "hour"] = "second"
    boot_s: float = Field(0.0, ge=0)
    min: int = Field(0, ge=0)
    max: int = Field(ge=0)
    bridges: str = ""

    @model_validator(mode="after")
    def _sized(self) -> PoolConfig:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        if self.price_per_hour == 0 and self.min != self.max:
            raise ValueError(
                f"a pool with price_per_hour 0 is owned machines, of a fixed size: "
                f"min ({self.min}) must equal max ({self.max})"
            )
        return self

    @property
    def step_s(self) -> int:
        return BILLING_STEP_S[self.billing_step]


#: the pools file, beside model.json
POOLS_FILE = "pools.json"


def load_pools(config_dir: Path) -> dict[str, PoolConfig]:
    """``pools.json``: pool name -> :class:`PoolConfig` (no file: no pools). A bad field
    stops the start with one line naming the file and the field."""
    path = config_dir / POOLS_FILE
    raw = _read_json(path, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be an object of pools")
    pools: dict[str, PoolConfig] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: field {name!r} must be an object")
        pool = _validate(PoolConfig, entry, path, name)
        pools[name] = pool.model_copy(update={"bridges": pool.bridges or f"{name}-*"})
    return pools


DEFAULT_MESSAGES: dict[str, dict[str, str]] = {
    "ERROR": {
        "JSONError": "消息格式错误，请联系服务商。",
        "OpcodeError": "错误提交，请稍后再试。",
        "BalanceError": "余额不足，请充值后继续使用。",
        "AssessmentError": "任务提交失败，请稍后再试。",
    },
    "TASK": {
        "TaskFailed": "任务执行失败，请稍后再试。",
        "TaskTimeout": "任务超时，请稍后再试。",
        "TaskCancelled": "任务已取消。",
        "TaskExpired": "任务排队超过最长等待时间，未开始执行，已取消且未扣费。",
        "AuthError": "认证失败，请检查 token。",
        "PlatformError": "不支持的平台。",
        "PayloadTooLarge": "消息过大。",
        "TaskConflict": "任务编号已被其他客户端使用。",
        "TaskNotFound": "任务不存在。",
        "TaskGone": "任务已结束。",
        "TaskNotRetryable": "只有失败或已取消的任务可以重试。",
        "UncertainSubmit": "任务提交结果未知，为避免重复扣费未再提交，请稍后查询或重试。",
        "MaxCostExceeded": "任务的预计费用超过了 maxCost 上限，未提交到付费平台。",
        "BudgetExceeded": "付费平台的预算已用完，任务未提交。",
        "NoCapableInstance": "暂无可运行该任务的计算节点，请稍后再试。",
        "UnknownNodeClass": "工作流中有计算节点均不支持的节点类型，请检查工作流。",
        "SignatureError": "签名校验失败。",
        "BridgeNotFound": "桥接节点不存在。",
        "ControlError": "管理操作无效，请检查参数。",
        "LinkExpired": "链接已过期。",
        "FileNotFound": "文件不存在。",
    },
    "SUCCESS": {"AssessmentSuccess": "任务提交成功，正在排队中..."},
}


class Messages:
    """code.json: client-facing messages by code, with the seed's Chinese defaults."""

    def __init__(self, data: dict[str, dict[str, str]] | None = None) -> None:
        self._by_code: dict[str, str] = {}
        for section in (DEFAULT_MESSAGES, data or {}):
            for messages in section.values():
                self._by_code.update(messages)

    def get(self, code: str, default: str = "") -> str:
        return self._by_code.get(code, default or code)


@dataclass
class PlatformConfig:
    """model.json + Platform.json + code.json, loaded and validated together."""

    accounts: dict[str, dict[str, PlatformAccount]]
    kinds: PlatformKinds
    messages: Messages
    #: each project's ``budget`` (projects without one are not listed)
    budgets: dict[str, ProjectBudget] = field(default_factory=dict)
    #: each project's ``share`` of our GPUs (projects without one are not listed)
    shares: dict[str, ProjectShare] = field(default_factory=dict)

    def account(self, aigc: str, platform: str) -> PlatformAccount | None:
        return self.accounts.get(aigc, {}).get(platform)

    def minimums_beyond(self, fleet: int) -> str:
        """What guarantees more GPUs than ``fleet`` (``AIGCQ_INTERNAL_CAPACITY_MAX``; 0:
        unknown, nothing is) in the projects' ``share.min`` ("": nothing does)."""
        total = sum(share.min for share in self.shares.values())
        if fleet <= 0 or total <= fleet:
            return ""
        mins = ", ".join(
            f"'{p}.share.min' {s.min}" for p, s in sorted(self.shares.items()) if s.min
        )
        return (
            f"the projects' guaranteed minimums ({mins}) add up to {total} GPUs, more than "
            f"AIGCQ_INTERNAL_CAPACITY_MAX={fleet}"
        )

    def kind_of(self, platform: str) -> str:
        return "polling" if platform in self.kinds.polling else "callback"

    def queues(self) -> list[tuple[str, str]]:
        return [(aigc, p) for aigc, platforms in self.accounts.items() for p in platforms]

    @classmethod
    def load(cls, config_dir: Path) -> PlatformConfig:
        raw_models = _read_json(config_dir / "model.json", {})
        if not isinstance(raw_models, dict):
            raise ConfigError(f"{config_dir / 'model.json'}: top level must be an object")
        accounts: dict[str, dict[str, PlatformAccount]] = {}
        budgets: dict[str, ProjectBudget] = {}
        shares: dict[str, ProjectShare] = {}
        models = config_dir / "model.json"
        for aigc, platforms in raw_models.items():
            if not isinstance(platforms, dict):
                raise ConfigError(f"{models}: field {aigc!r} must be an object")
            platforms = dict(platforms)
            if BUDGET_KEY in platforms:
                raw_budget = platforms.pop(BUDGET_KEY)
                budgets[aigc] = _validate(ProjectBudget, raw_budget, models, f"{aigc}.{BUDGET_KEY}")
            if SHARE_KEY in platforms:
                raw_share = platforms.pop(SHARE_KEY)
                shares[aigc] = _validate(ProjectShare, raw_share, models, f"{aigc}.{SHARE_KEY}")
            accounts[aigc] = {
                name: _validate(
                    ACCOUNT_MODELS.get(name, PlatformAccount),
                    entry,
                    config_dir / "model.json",
                    f"{aigc}.{name}",
                )
                for name, entry in platforms.items()
            }
        kinds_raw = _read_json(config_dir / "Platform.json", None)
        kinds = (
            PlatformKinds()
            if kinds_raw is None
            else _validate(PlatformKinds, kinds_raw, config_dir / "Platform.json", "")
        )
        code_raw = _read_json(config_dir / "code.json", {})
        _check_messages(code_raw, config_dir / "code.json")
        return cls(accounts, kinds, Messages(code_raw), budgets, shares)


def _check_messages(raw: Any, path: Path) -> None:
    """code.json: sections (``ERROR``, ``TASK`` …) of code -> message text."""
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"{path}: sections must be objects of messages")
    for section, messages in raw.items():
        for code, text in messages.items():
            if not isinstance(text, str):
                raise ConfigError(f"{path}: field '{section}.{code}': the message must be text")


def _read_json(path: Path, default: Any) -> Any:
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


def _validate(model: type[_M], data: Any, path: Path, where: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in (where, *first["loc"]) if p != "")
        hint = _did_you_mean(model, first) if first["type"] == "extra_forbidden" else ""
        raise ConfigError(f"{path}: field {field!r}: {first['msg']}{hint}") from exc


def _did_you_mean(model: type[BaseModel], error: Any) -> str:
    """``; did you mean 'concurrency'?`` for a misspelt key, else ``""``."""
    close = difflib.get_close_matches(str(error["loc"][-1]), list(model.model_fields), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
