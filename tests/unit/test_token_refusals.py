"""A refused client token says why and what to send (issue 30 item 5): an expired one when
it expired; ``aigcq token`` mints no token that is dead on arrival."""

from __future__ import annotations

import time

import jwt
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.config import Settings
from aigcq.plumbing.auth import CLIENT_TOKEN_HINT, NO_CLIENT_SECRET, Auth, issue_client_token

SECRET = "s" * 32


def test_an_expired_token_says_when_it_expired() -> None:
    auth = Auth(Settings(token_secret=SECRET))
    expired = jwt.encode({"sub": "b1", "exp": 1_700_000_000}, SECRET, "HS256")
    assert auth.client(expired) is None
    why = auth.refusal(expired, "invalid")
    assert why.startswith("token expired at 2023-11-14T22:13:20Z: ") and "TOKEN_SECRET" in why


def test_other_refusals_name_what_to_send() -> None:
    auth = Auth(Settings(token_secret=SECRET))
    forged = jwt.encode({"sub": "b1", "exp": time.time() - 10}, "another secret", "HS256")
    assert auth.refusal(forged, "invalid") == f"invalid: {CLIENT_TOKEN_HINT}"
    assert auth.refusal(None, "missing") == f"missing: {CLIENT_TOKEN_HINT}"
    assert auth.refusal("not a jwt", "invalid") == f"invalid: {CLIENT_TOKEN_HINT}"
    assert auth.client(issue_client_token(SECRET, "b1")) is not None
    assert "TOKEN_SECRET" in CLIENT_TOKEN_HINT and "AIGCQ_CLIENT_TOKENS" in CLIENT_TOKEN_HINT


def test_a_jwt_without_exp_is_told_why() -> None:
    auth = Auth(Settings(token_secret=SECRET))
    forever = jwt.encode({"sub": "b1"}, SECRET, "HS256")  # as the original system's tokens
    assert auth.client(forever) is None
    assert "has no exp" in auth.refusal(forever, "invalid") and "aigcq token" in auth.refusal(
        forever, "invalid"
    )


def test_a_server_without_client_secrets_says_so() -> None:
    assert Auth(Settings()).refusal("x", "invalid") == f"invalid: {NO_CLIENT_SECRET}"


def test_a_non_positive_ttl_is_refused_before_anything_is_minted() -> None:
    for ttl in ("0", "-5"):
        result = CliRunner().invoke(
            app, ["token", "me", "--ttl", ttl], env={"TOKEN_SECRET": SECRET}
        )
        assert result.exit_code == 2, result.output
        assert "--ttl" in result.output and result.stdout.count(".") < 2  # no JWT printed
