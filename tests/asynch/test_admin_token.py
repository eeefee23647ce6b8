"""model-asynch's management routes need an admin token unless the operator opens them
(issue 25 item 9): ``aigcq asynch`` generates one the way ``aigcq up`` does, keeps it in
``AIGCQ_DATA_DIR/secrets.json`` and prints where it is; a call without it gets 401 naming
the settings; ``AIGCQ_ASYNCH_ADMIN_OPEN=true`` is the explicit off switch."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.fakes.asynch import Asynch
from tests.fakes.processes import start_asynch, stop


async def test_no_token_configured_refuses_naming_both_settings(asynch: Asynch) -> None:
    asynch.svc.settings.admin_token = ""
    message = await asynch.error("GET", "/model/listModel", "UNAUTHORIZED")
    assert "AIGCQ_ASYNCH_ADMIN_TOKEN" in message and "AIGCQ_ASYNCH_ADMIN_OPEN" in message


async def test_a_call_without_the_token_is_told_what_to_send(asynch: Asynch) -> None:
    response = await asynch.call("GET", "/model/listModel", headers={"Authorization": ""})
    body = response.json()
    assert response.status_code == 401 and body["reason"] == "UNAUTHORIZED"
    assert "AIGCQ_ASYNCH_ADMIN_TOKEN" in body["message"] and "secrets.json" in body["message"]


async def test_the_off_switch_opens_the_routes(asynch: Asynch) -> None:
    asynch.svc.settings.admin_token = ""
    asynch.svc.settings.admin_open = True
    await asynch.ok("GET", "/model/listModel", headers={"Authorization": ""})


def test_aigcq_asynch_generates_its_token_and_says_where(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "asynch.log"
    proc, url = start_asynch(
        pg_url, redis_url, tmp_path, log=log, args=("serve",), AIGCQ_ASYNCH_ADMIN_TOKEN=""
    )
    try:
        assert httpx.get(f"{url}/model/listModel").status_code == 401
        secrets = tmp_path / "secrets.json"
        token = json.loads(secrets.read_text())["asynch_admin_token"]
        assert oct(secrets.stat().st_mode & 0o777) == "0o600"
        ok = httpx.get(f"{url}/model/listModel", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        said = log.read_text()
        # said where it is kept; a log is no terminal: never its value (issue 42 item 13)
        assert str(secrets) in said and "generated asynch_admin_token (kept in" in said, said
        assert token not in said, said
    finally:
        stop(proc)
    proc, url = start_asynch(
        pg_url, redis_url, tmp_path, log=log, args=("serve",), AIGCQ_ASYNCH_ADMIN_TOKEN=""
    )
    try:  # the same token after a restart
        ok = httpx.get(f"{url}/model/listModel", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and token not in log.read_text()
    finally:
        stop(proc)
