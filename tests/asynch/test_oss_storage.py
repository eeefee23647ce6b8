"""Results uploaded to the seed's OSS service, with the caller's identity passed through."""

from __future__ import annotations

import pytest

from aigcq.storage import StorageSettings
from tests.fakes.asynch import USER, Asynch, Served


@pytest.fixture
def storage_settings(oss_emu: Served) -> StorageSettings:
    return StorageSettings(kind="oss", oss_url=oss_emu.url)


async def test_oss_upload_forwards_identity(
    oss_emu: Served, asynch: Asynch, model_emu: Served
) -> None:
    await asynch.create_model("m", model_emu.url)
    oss_emu.app.state.oss.fail_next = 1  # the first upload fails and is retried
    task_id = await asynch.create_task("m", {"_response": "text"}, headers=USER)
    await asynch.wait_state(task_id, 2)
    row = await asynch.row(task_id)
    assert row["oss_file"].startswith(f"{oss_emu.url}/oss/file/") and row["file_type"] == "txt"
    (upload,) = oss_emu.app.state.oss.uploads.values()
    assert upload.authorization == "Bearer x" and upload.user_info == USER["X-User-Info"]
    assert upload.data == b"generated text for /gen"
    assert (await model_emu.stats())["calls"] == 1  # upload retries are not model calls
