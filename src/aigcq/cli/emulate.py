"""``aigcq emulate ...``: real look-alike servers of the external services."""

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from aigcq.cli.common import HostOption, LogLevelOption, PortOption, require_free_ports
from aigcq.observability.logconfig import configure_logging

emulate_app = typer.Typer(no_args_is_help=True, help="Run an emulator of an external service.")


def _prepare(host: str, port: int, log_level: str) -> None:
    """What every emulator does before it serves: its logging, and a port it can listen on."""
    configure_logging(log_level)
    require_free_ports(host, [(port, "--port")])


@emulate_app.command("comfyui")
def emulate_comfyui(
    host: HostOption = "127.0.0.1",
    port: PortOption = 8188,
    step_time: Annotated[float, typer.Option(help="Seconds per progress step")] = 0.05,
    steps: Annotated[int, typer.Option(help="Progress steps per executed node")] = 4,
    fail_rate: Annotated[float, typer.Option(help="Probability a prompt fails")] = 0.0,
    output_dir: Annotated[Path, typer.Option(help="Where SaveImage writes")] = Path(
        ".aigcq/comfyui/output"
    ),
    checkpoint: Annotated[
        list[str] | None, typer.Option(help="A model file CheckpointLoaderSimple offers")
    ] = None,
    model_load_time: Annotated[float, typer.Option(help="Seconds to switch checkpoints")] = 0.0,
    interrupt_latency: Annotated[
        float, typer.Option(help="Seconds a prompt goes on after /interrupt (real: ~1)")
    ] = 0.0,
    node: Annotated[
        list[str] | None, typer.Option(help="Only these node classes (default: all)")
    ] = None,
    device: Annotated[str, typer.Option(help="The device /system_stats names")] = "cpu",
    vram_mb: Annotated[
        int, typer.Option(help="Its VRAM in MiB (default: none, a CPU device)", show_default=False)
    ] = 0,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a ComfyUI emulator (EmptyImage, ImageInvert, SaveImage, PreviewImage,
    CheckpointLoaderSimple, EmptyLatentImage, VAEDecode)."""
    from aigcq.emulators.comfyui import ComfyUIConfig, run

    _prepare(host, port, log_level)
    config = ComfyUIConfig(
        output_dir=output_dir,
        step_time=step_time,
        steps=steps,
        fail_rate=fail_rate,
        node_classes=frozenset(node) if node else None,
        checkpoints=tuple(checkpoint or ("sd15.safetensors",)),
        model_load_time=model_load_time,
        interrupt_latency=interrupt_latency,
        device=device,
        vram_total=vram_mb * 2**20,
        vram_free=vram_mb * 2**20,
    )
    run(host, port, config)


@emulate_app.command("model-service")
def emulate_model_service(
    host: HostOption = "127.0.0.1",
    port: PortOption = 8092,
    latency: Annotated[float, typer.Option(help="Seconds per call")] = 0.0,
    failure_rate: Annotated[float, typer.Option(help="Share of calls answered HTTP 500")] = 0.0,
    response: Annotated[str, typer.Option(help="json | text | image")] = "json",
    log_level: LogLevelOption = "WARNING",
) -> None:
    """Run an HTTP model service emulator (stats at /_emulator/stats)."""
    from aigcq.emulators.model_service import ModelBehaviour, run

    _prepare(host, port, log_level)
    run(host, port, ModelBehaviour(latency, failure_rate, response))  # type: ignore[arg-type]


@emulate_app.command("oss")
def emulate_oss(
    host: HostOption = "127.0.0.1", port: PortOption = 8093, log_level: LogLevelOption = "WARNING"
) -> None:
    """Run the OSS file service emulator (oss/file/uploadFile)."""
    from aigcq.emulators.oss import run

    _prepare(host, port, log_level)
    run(host, port)


@emulate_app.command("prompts-core")
def emulate_prompts_core(
    host: HostOption = "127.0.0.1", port: PortOption = 8094, log_level: LogLevelOption = "WARNING"
) -> None:
    """Run the prompts-core emulator (prompt/createPrompt)."""
    from aigcq.emulators.prompts_core import run

    _prepare(host, port, log_level)
    run(host, port)


_ApiKeys = Annotated[
    list[str] | None, typer.Option("--api-key", help="Accepted key; repeat. Default: any")
]
_Duration = Annotated[float, typer.Option("--duration", help="Seconds a task runs (0 = instant)")]
_FailureRate = Annotated[float, typer.Option(help="Share of tasks that fail, 0..1")]
_FileTtl = Annotated[
    float,
    typer.Option(
        "--file-ttl", help="Seconds a result file's link works (then 404/403; the vendors': ~1 day)"
    ),
]


def _serve_platform(
    run: Callable[..., None],
    host: str,
    port: int,
    log_level: str,
    duration: float,
    failure_rate: float,
    **options: Any,
) -> None:
    """Serve a platform emulator's ``run``: ``duration`` and ``failure_rate`` are what every
    one has (``EmulatorConfig``), ``options`` its own config fields."""
    _prepare(host, port, log_level)
    run(host, port, duration_s=duration, failure_rate=failure_rate, **options)


def _key_set(api_key: list[str] | None) -> set[str] | None:
    """The keys ``--api-key`` accepts: None (any key) when it is not given."""
    return set(api_key) if api_key else None


#: the workflow ids ``aigcq emulate runninghub`` knows unless told: the README's tour's
DEFAULT_WORKFLOW_IDS = ["1"]


@emulate_app.command("runninghub")
def emulate_runninghub(
    host: HostOption = "127.0.0.1",
    port: PortOption = 9101,
    max_concurrent: Annotated[int, typer.Option(help="QUEUED+RUNNING per apiKey, then 421")] = 3,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    api_key: _ApiKeys = None,
    consume_coins: Annotated[
        int, typer.Option(min=0, help="consumeCoins each task's outputs report")
    ] = 10,
    consume_money: Annotated[
        float | None, typer.Option(min=0, help="consumeMoney each reports (default: null)")
    ] = None,
    remain_coins: Annotated[
        int, typer.Option(help="the account's remainCoins before any task (accountStatus)")
    ] = 177814,
    file_ttl: _FileTtl = 86400.0,
    workflow_id: Annotated[
        list[str],
        typer.Option(
            "--workflow-id",
            help="A workflow id that exists (repeat); a create for another one is refused "
            "380 WORKFLOW_NOT_EXISTS, as RunningHub does [default: 1, the README's]",
            show_default=False,
        ),
    ] = DEFAULT_WORKFLOW_IDS,
    any_workflow: Annotated[
        bool,
        typer.Option(
            "--any-workflow", help="Accept any workflow id (load tests; not as RunningHub does)"
        ),
    ] = False,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a RunningHub emulator (/task/openapi/*, webhooks; stats at /_emulator/stats,
    result links expired on demand by POST /_emulator/files)."""
    from aigcq.emulators.runninghub import run

    _serve_platform(
        run,
        host,
        port,
        log_level,
        duration,
        failure_rate,
        max_concurrent=max_concurrent,
        api_keys=_key_set(api_key),
        consume_coins=consume_coins,
        consume_money=consume_money,
        remain_coins=remain_coins,
        file_ttl_s=file_ttl,
        workflow_ids=None if any_workflow else frozenset(workflow_id),
    )


@emulate_app.command("coze")
def emulate_coze(
    host: HostOption = "127.0.0.1",
    port: PortOption = 9102,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    api_key: _ApiKeys = None,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a Coze emulator (workflow run + run_histories; stats at /_emulator/stats)."""
    from aigcq.emulators.coze import run

    _serve_platform(run, host, port, log_level, duration, failure_rate, tokens=_key_set(api_key))


@emulate_app.command("jimuai")
def emulate_jimuai(
    host: HostOption = "127.0.0.1",
    port: PortOption = 9103,
    access_key: Annotated[str, typer.Option(help="Accepted access key")] = "AKLTemulator",
    secret_key: Annotated[
        str, typer.Option(help="Its secret key", envvar="AIGCQ_EMULATOR_JIMUAI_SK")
    ] = "emulator-secret",
    max_concurrent: Annotated[
        int, typer.Option(help="in_queue+generating per key, then 50430")
    ] = 5,
    qps: Annotated[
        float, typer.Option(help="Submits per second per key, then 50429 (0 = any)")
    ] = 0.0,
    queue_s: Annotated[float, typer.Option("--queue", help="Seconds in_queue")] = 0.0,
    duration: _Duration = 1.0,
    failure_rate: _FailureRate = 0.0,
    base64_only: Annotated[bool, typer.Option(help="Results only as base64")] = False,
    outputs: Annotated[
        int, typer.Option(min=1, max=15, help="Images per task (each billed) unless force_single")
    ] = 1,
    file_ttl: _FileTtl = 86400.0,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a JimuAI (即梦, Volcengine visual API) emulator: signed CVSync2AsyncSubmitTask /
    CVSync2AsyncGetResult; stats at /_emulator/stats, failures via /_emulator/inject, result
    links expired on demand by POST /_emulator/files."""
    from aigcq.emulators.jimuai import run

    _serve_platform(
        run,
        host,
        port,
        log_level,
        duration,
        failure_rate,
        credentials={access_key: secret_key},
        max_concurrent=max_concurrent,
        qps=qps,
        queue_s=queue_s,
        base64_only=base64_only,
        outputs=outputs,
        file_ttl_s=file_ttl,
    )
