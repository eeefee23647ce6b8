"""A refused client token says why: an expired one when it expired; ``aigcq token`` mints
no token that is dead on arrival."""

from __future__ import annotations

import time

import jwt
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.config import Settings
from aigcq.plumbing.auth import Auth, issue_client_token

SECRET = "s" * 32


def test_an_expired_token_says_when_it_expired() -> None:
    auth = Auth(Settings(token_secret=SECRET))
    expired = jwt.encode({"sub": "b1", "exp": 1_700_000_000}, SECRET, "HS256")
    assert auth.client(expired) is None
    assert auth.refusal(expired, "invalid") == "token expired at 2023-11-14T22:13:20Z"


def test_other_refusals_keep_the_plain_message() -> None:
    auth = Auth(Settings(token_secret=SECRET))
    forged = jwt.encode({"sub": "b1", "exp": time.time() - 10}, "another secret", "HS256")
    assert auth.refusal(forged, "invalid") == "invalid"
    assert auth.refusal(None, "missing") == "missing"
    assert auth.refusal("not a jwt", "invalid") == "invalid"
    assert auth.client(issue_client_token(SECRET, "b1")) is not None


def test_a_non_positive_ttl_is_refused_before_anything_is_minted() -> None:
    for ttl in ("0", "-5"):
        result = CliRunner().invoke(
            app, ["token", "me", "--ttl", ttl], env={"TOKEN_SECRET": SECRET}
        )
        assert result.exit_code == 2, result.output
        assert "--ttl" in result.output and result.stdout.count(".") < 2  # no JWT printed
