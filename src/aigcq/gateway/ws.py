"""The client WebSocket (seed 001): ``ws://host:WS_PORT/?token=...&id=<backendId>``.

Client -> server: ``generate`` (submit), ``ack`` (with ``id`` or ``ids`` of results, when
connected with ``ack=1``), ``cancel`` (``taskId``), ``ping``.
Server -> client: ``submitted`` (with the task's ``position`` and ``etaStartMs``),
``result`` (from the outbox), ``error``, ``pong``, ``QUEUE_UPDATE`` (a waiting task's
estimate moved: :mod:`aigcq.gateway.queue_updates`; not with ``queue=0``), and with
``progress=1`` live ``progress`` messages.
Bad input gets an ``error`` message with its code; the connection stays up. Binary frames
are read like text frames (UTF-8 JSON); any other bytes are ``JSONError``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from aigcq.domain import ErrorCode
from aigcq.gateway.clients import ClientConnection
from aigcq.gateway.errors import ClientError
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.submission import MAX_BACKEND_ID, parse_generate
from aigcq.plumbing.background import REDIS_OUTAGE
from aigcq.plumbing.js_values import id_text
from aigcq.plumbing.ws_frames import close_within, receive_frame, send_within

log = logging.getLogger(__name__)

CLOSE_AUTH = 4401
CLOSE_BAD_REQUEST = 4400
CLOSE_TRY_AGAIN = 1013  # RFC 6455: try again later


async def client_endpoint(ws: WebSocket, gw: Gateway) -> None:
    token = ws.query_params.get("token")
    backend_id = ws.query_params.get("id", "")
    await ws.accept()
    failure: tuple[ClientError, int] | None = None
    principal = gw.auth.client(token)
    if principal is None:
        why = gw.auth.refusal(token, "invalid or missing token (?token=)")
        failure = (ClientError(ErrorCode.AUTH, why), CLOSE_AUTH)
    elif not backend_id or len(backend_id) > MAX_BACKEND_ID:
        failure = (ClientError(ErrorCode.JSON, "query parameter id is required"), CLOSE_BAD_REQUEST)
    elif not principal.may_use(backend_id):
        failure = (
            ClientError(ErrorCode.AUTH, gw.auth.id_refusal(principal, "id", backend_id)),
            CLOSE_AUTH,
        )
    if failure is not None:
        await _refuse(ws, gw, *failure)
        return
    assert principal is not None  # refused above otherwise
    query = ws.query_params
    conn = ClientConnection(
        ws,
        backend_id,
        principal=principal.name,
        auto_ack=query.get("ack") != "1",
        progress=query.get("progress") == "1",
        queue_updates=query.get("queue") != "0",
        send_timeout_s=gw.settings.client_send_timeout_s,
    )
    try:
        await gw.clients.attach(conn)
    except REDIS_OUTAGE as exc:
        gw.clients.detach(conn)
        log.warning("client %s: refused, Redis unavailable (%s)", backend_id, exc)
        await _refuse(ws, gw, _storage_unavailable(), CLOSE_TRY_AGAIN)
        return
    log.info("client %s: connected", backend_id)
    try:
        while (raw := await receive_frame(ws)) is not None:
            reply = await handle_message(gw, conn, raw)
            if reply is not None:
                await conn.send(reply)
    except (WebSocketDisconnect, TimeoutError):  # gone, or dropped for not reading
        pass
    finally:
        gw.clients.detach(conn)
        log.info("client %s: disconnected", backend_id)


async def handle_message(
    gw: Gateway, conn: ClientConnection, raw: str | bytes
) -> dict[str, Any] | None:
    try:
        return await _dispatch(gw, conn, _decode(raw, gw.settings.max_payload_bytes))
    except ClientError as exc:
        error = exc
    except REDIS_OUTAGE as exc:
        log.warning("client %s: Redis unavailable (%s)", conn.backend_id, exc)
        error = _storage_unavailable()
    log.info("client %s: rejected message: %s", conn.backend_id, error)
    return error.body(gw.messages)


async def _refuse(ws: WebSocket, gw: Gateway, error: ClientError, close_code: int) -> None:
    timeout_s = gw.settings.client_send_timeout_s
    with contextlib.suppress(Exception):  # gone already, or not reading: nothing to tell it
        await send_within(ws, orjson.dumps(error.body(gw.messages)).decode(), timeout_s)
    await close_within(ws, close_code, error.code.value, timeout_s)


def _storage_unavailable() -> ClientError:
    return ClientError(ErrorCode.ASSESSMENT, "storage unavailable")


def _decode(raw: str | bytes, limit: int) -> dict[str, Any]:
    if len(raw) > limit:
        raise ClientError(ErrorCode.PAYLOAD_TOO_LARGE, f"message over {limit} bytes")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(ErrorCode.JSON, f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ClientError(ErrorCode.JSON, "a message is an object with a string 'type'")
    return data


async def _dispatch(
    gw: Gateway, conn: ClientConnection, data: dict[str, Any]
) -> dict[str, Any] | None:
    kind = data["type"]
    if kind == "generate":
        req = parse_generate(data)
        created = await gw.submission.submit(
            req, conn.backend_id, deliver=True, principal=conn.principal
        )
        return {
            "type": "submitted",
            "code": "AssessmentSuccess",
            "msg": gw.messages.get("AssessmentSuccess"),
            "taskId": req.taskId,
            "duplicate": not created,
            **gw.estimate(req, created),
        }
    if kind == "ack":
        ids = _ack_ids(data)
        try:
            await gw.outbox.ack(conn.backend_id, ids)
        except REDIS_OUTAGE:  # deleted by this connection's next drain, once Redis answers
            conn.cursor.unacked.extend(ids)
            raise
        return None
    if kind == "cancel":
        task_id = id_text(data.get("taskId"))
        if not isinstance(task_id, str):
            raise ClientError(ErrorCode.JSON, "taskId: a string is required")
        state = await gw.cancel(task_id, frozenset([conn.backend_id]))
        return {"type": "cancelled", "taskId": task_id, "state": state}
    if kind == "ping":
        return {"type": "pong"}
    raise ClientError(ErrorCode.OPCODE, f"unknown message type {kind!r}")


def _ack_ids(data: dict[str, Any]) -> list[str]:
    """The result ids an ``ack`` names: ``ids`` (a list of strings) or ``id`` (a string)."""
    ids = data.get("ids")
    if ids is not None:
        if isinstance(ids, list) and all(isinstance(i, str) for i in ids):
            return ids
        raise ClientError(ErrorCode.JSON, "ids: a list of strings is required")
    if isinstance(data.get("id"), str):
        return [data["id"]]
    raise ClientError(ErrorCode.JSON, "id: a string (or ids: a list of strings) is required")
