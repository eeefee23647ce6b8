"""What the components of a serve process see of the process that assembled them.

The admin API, shutdown and the metrics source take a :class:`ServeParts` instead of
:class:`~aigcq.serve.server.ServeProcess`, so none of them imports the module that imports
them. An :class:`Extension` is what a process built on a serve process adds to it (the
standalone message-dispatcher's API, capacity feed and loops), built in its constructor.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI
from starlette.routing import BaseRoute

from aigcq.bridges.hub import BridgeHub
from aigcq.gateway.gateway import Gateway
from aigcq.runtime import Runtime
from aigcq.scheduler.accounts import Reconciler
from aigcq.scheduler.dispatch import DispatchLoop
from aigcq.scheduler.lifecycle import Lifecycle
from aigcq.scheduler.paid import PaidPlatforms
from aigcq.scheduler.targets import InternalTarget

#: a loop run while the app is up
BackgroundLoop = Callable[[], Coroutine[Any, Any, None]]


class CapacityView(Protocol):
    """What the admin snapshot shows of the capacity planner (``serve.capacity``)."""

    @property
    def pools(self) -> Mapping[str, object]: ...

    def view(self) -> dict[str, Any]: ...


class ServeParts(Protocol):
    rt: Runtime
    lifecycle: Lifecycle
    gateway: Gateway
    hub: BridgeHub | None
    internal: InternalTarget | None
    dispatch: DispatchLoop
    paid: PaidPlatforms
    reconciler: Reconciler

    @property
    def capacity(self) -> CapacityView: ...


@dataclass
class Extension:
    """Routes, WebSocket endpoints and loops added to a serve process."""

    routes: list[BaseRoute] = field(default_factory=list)
    websockets: dict[str, Callable[..., Coroutine[Any, Any, None]]] = field(default_factory=dict)
    loops: list[BackgroundLoop] = field(default_factory=list)
    #: amends the API's OpenAPI description (its title, its added routes)
    describe: Callable[[FastAPI], None] = lambda api: None


#: builds an :class:`Extension` from the serve process under construction
Extend = Callable[[ServeParts], Extension]
