"""What the components of a serve process see of the process that assembled them.

The admin API, shutdown, the metrics source and the message-dispatcher's internal target
take a :class:`ServiceParts` instead of :class:`~aigcq.service.server.Service`, so none of
them imports the module that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from aigcq.bridges.hub import BridgeHub
from aigcq.gateway.service import Gateway
from aigcq.scheduler.dispatcher import Dispatcher, InternalTarget
from aigcq.scheduler.outcomes import Outcomes
from aigcq.service.runtime import Runtime

#: a loop run while the app is up
BackgroundLoop = Callable[[], Coroutine[Any, Any, None]]
#: builds a process's internal target other than its own bridge hub (it may add loops)
InternalTargetBuilder = Callable[[Runtime, Outcomes, list[BackgroundLoop]], InternalTarget]


class ServiceParts(Protocol):
    @property
    def rt(self) -> Runtime: ...

    @property
    def outcomes(self) -> Outcomes: ...

    @property
    def gateway(self) -> Gateway: ...

    @property
    def hub(self) -> BridgeHub | None: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def background(self) -> list[BackgroundLoop]: ...
