"""A bridge's result files are reachable by their signed, expiring fileUrl only (issue 42
item 7): an unsigned link (``/files/{taskId}/{filename}``, guessable from the client's
taskId and ComfyUI's counter), a forged, expired or non-ASCII signature, or another file's
signature is 403 ``SignatureError``. The reference bridge against a ComfyUI emulator."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from aigcq.agent.app import Bridge
from aigcq.wire.links import signed_url
from tests.fakes.agent_hub import Env, env

__all__ = ["env"]  # a fixture: imported for pytest to find

NAME = "out_00001_.png"


async def test_result_files_need_their_signed_link(env: Env) -> None:
    node_info = [{"nodeId": "3", "fieldName": "filename_prefix", "fieldValue": "out"}]
    async with Bridge(env.settings) as bridge:
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("t1", nodeInfoList=node_info))
        [file] = (await env.end_for("t1"))["data"]
        url = file["fileUrl"]
        assert (await env.http.get(url)).status_code == 200
        token = urlsplit(url).path.split("/")[2]
        expires, _, signature = token.partition("-")
        assert int(expires) > time.time() + 6 * 86400, token  # a week by default
        base = bridge.public_url
        forged = "0" * len(signature) if signature != "0" * len(signature) else "1" * 32
        expired = signed_url(base, bridge.file_key, f"t1/{NAME}", int(time.time()) - 1, "/files")
        refused = {
            "unsigned": f"{base}/files/t1/{NAME}",
            "forged": f"{base}/files/{expires}-{forged}/t1/{NAME}",
            "later expiry": f"{base}/files/{int(expires) + 1}-{signature}/t1/{NAME}",
            "expired": expired,
            "non-ASCII": f"{base}/files/{expires}-%C3%A9/t1/{NAME}",
            "no expiry": f"{base}/files/-{signature}/t1/{NAME}",
            "another file": f"{base}/files/{token}/t2/{NAME}",
        }
        for why, link in refused.items():
            answer = await env.http.get(link)
            assert answer.status_code == 403, (why, answer.status_code, answer.text)
            assert answer.json()["code"] == "SignatureError", (why, answer.text)
