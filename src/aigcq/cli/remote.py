"""How a client command reaches the server: ``--server`` and ``--token``, the HTTP API's
answers, and what can be expected to go wrong (no token, bad input, the server down or
refusing) as one line on stderr and exit 1 (the server) or 2 (the input).

A refusal reads ``error: <code>: <the server's message> (<detail>)``, e.g. ``error:
TaskNotFound: 任务不存在。 (no such task)``. What a command calls is imported when it runs
(:mod:`aigcq.cli.http_api`, the SDK): the server's libraries never load for a client command.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from aigcq.cli.common import fail
from aigcq.plumbing.ports import local_host

if TYPE_CHECKING:
    from aigcq.cli.client_env import ClientEnv
    from aigcq.cli.http_api import Api
    from aigcq.client.types import AigcqError

TOKEN_ENV = "AIGCQ_CLIENT_TOKEN"
ADMIN_TOKEN_ENV = "AIGCQ_ADMIN_TOKEN"
ServerOption = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="aigcq's address (default: where `aigcq up` listens: AIGCQ_HOST, AIGCQ_WS_PORT)",
    ),
]
TokenOption = Annotated[
    str,
    typer.Option(envvar=TOKEN_ENV, show_default=False, help="Client token (`aigcq token ID`)"),
]
AdminTokenOption = Annotated[
    str,
    typer.Option(
        envvar=ADMIN_TOKEN_ENV,
        show_default=False,
        help=f"The admin token [default: the server's where `aigcq up` runs, else {TOKEN_ENV}]",
    ),
]


class InputError(Exception):
    """A bad argument, token or input file (exit code 2)."""


@contextlib.contextmanager
def client_errors(server: str, unreachable: tuple[type[Exception], ...]) -> Iterator[None]:
    """Report the failures a client command can expect as one line and an exit code;
    ``unreachable``: the errors that mean the server at ``server`` could not be reached."""
    from aigcq.cli.http_api import ReplyError
    from aigcq.client.types import AigcqError

    try:
        yield
    except InputError as exc:
        fail(str(exc), 2, exc)
    except AigcqError as exc:
        fail(refusal(exc), 1, exc)
    except ReplyError as exc:
        fail(str(exc), 1, exc)
    except unreachable as exc:
        reason = str(exc) or type(exc).__name__
        fail(f"cannot reach the aigcq server at {server}: {reason}", 1, exc)


def refusal(exc: AigcqError) -> str:
    """``AuthError: <the server's message> (<detail>)``."""
    detail = f" ({exc.detail})" if exc.detail else ""
    return f"{exc.code}: {exc.msg or 'refused by the server'}{detail}"


_SECURE = {"http": "", "ws": "", "https": "s", "wss": "s"}


def server_url(server: str | None, scheme: str) -> str:
    """Where a client command connects, with its scheme (``ws`` or ``http``): ``server``
    (``http://`` and ``ws://`` both work) or, by default, where ``aigcq up`` with the same
    settings (``AIGCQ_HOST``, ``AIGCQ_WS_PORT``, environment or ``.env``) listens."""
    if server is None:
        settings = local_settings()
        return f"{scheme}://{local_host(settings.host)}:{settings.ws_port}/"
    given, sep, rest = server.partition("://")
    if not sep:
        return f"{scheme}://{server}"
    secure = _SECURE.get(given.lower())
    return server if secure is None else f"{scheme}{secure}://{rest}"


def local_settings() -> ClientEnv:
    """The settings of the server run here that a client command uses (environment, then
    ``./.env``), or exit 2 naming the malformed one, as a server command would."""
    from aigcq.cli.client_env import ClientEnvError, read

    try:
        return read()
    except ClientEnvError as exc:
        fail(f"configuration error: {exc}", 2, exc)


def require_token(token: str) -> str:
    """A client command's token: ``token`` (``--token``, else ``AIGCQ_CLIENT_TOKEN``)."""
    if not token:
        raise InputError(f"no token: pass --token or set {TOKEN_ENV} (`aigcq token ID` prints one)")
    return token


def operator_token(token: str) -> str:
    """The token of every operator's verb, found one way: ``token`` (``--token``, else
    ``AIGCQ_ADMIN_TOKEN``); else, run where the server runs, its own admin token (its
    settings, or the secrets file ``aigcq up`` keeps); else ``AIGCQ_CLIENT_TOKEN`` (which
    may hold the admin token too)."""
    if token:
        return token
    settings = local_settings()
    found = settings.admin_token or settings.stored_secrets().get("admin_token", "")
    found = found or os.environ.get(TOKEN_ENV, "")
    if not found:
        raise InputError(
            f"no token: pass --token or set {ADMIN_TOKEN_ENV}, or run this where `aigcq up` "
            f"runs ({settings.secrets_file} has no admin token)"
        )
    return found


@contextlib.contextmanager
def api(server: str | None, token: str) -> Iterator[Api]:
    """The server's API for an operator's verb, with :func:`operator_token`, inside
    :func:`client_errors`."""
    from http.client import HTTPException

    from aigcq.cli.http_api import Api

    url = server_url(server, "http")
    with client_errors(url, (OSError, HTTPException)):  # HTTPException: not HTTP at all
        yield Api(url, operator_token(token))
