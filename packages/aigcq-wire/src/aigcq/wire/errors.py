"""The error codes a client sees (``{"type": "error", "code": ...}``, a failed task's
``errorCode``, an HTTP refusal's ``code``), shared by the server, the bridge's own HTTP
server and the SDK: the seed's code.json keys and ours. Their messages are the server's
(``config.DEFAULT_MESSAGES``, overridable by an operator)."""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Client-visible error codes. The first four are the seed's code.json keys."""

    JSON = "JSONError"
    OPCODE = "OpcodeError"
    BALANCE = "BalanceError"
    ASSESSMENT = "AssessmentError"
    AUTH = "AuthError"
    PLATFORM = "PlatformError"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    NOT_FOUND = "TaskNotFound"
    CONFLICT = "TaskConflict"
    TASK_FAILED = "TaskFailed"
    TASK_TIMEOUT = "TaskTimeout"
    TASK_CANCELLED = "TaskCancelled"
    #: its start deadline (``maxWaitMs``) passed before it started anywhere (nothing paid)
    TASK_EXPIRED = "TaskExpired"
    SIGNATURE = "SignatureError"
    GONE = "TaskGone"
    NOT_RETRYABLE = "TaskNotRetryable"
    UNCERTAIN_SUBMIT = "UncertainSubmit"
    BRIDGE_NOT_FOUND = "BridgeNotFound"
    MAX_COST = "MaxCostExceeded"
    BUDGET = "BudgetExceeded"  # a paid budget or balance floor reached (the project fails)
    CONTROL = "ControlError"  # an operator's control names nothing it can act on
    LINK_EXPIRED = "LinkExpired"
    FILE_NOT_FOUND = "FileNotFound"
    #: a workflow's node class that no bridge of the cluster offers: the client's mistake
    UNKNOWN_NODE_CLASS = "UnknownNodeClass"
