"""What each platform declares about itself (:class:`PlatformSpec`), and the one list of them.

Each adapter's module registers its spec; importing :mod:`aigcq.platforms` registers the
built-in ones, in its order. What differs by platform outside its adapter (its base URL, the
workflow field of its payloads, its model.json account, the cost it reports, whether its
result links expire, its emulator) is read from here, never switched on by name.
``tests/unit/test_platform_registry.py`` checks every spec is complete and agrees with the
settings that name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aigcq.config import PlatformAccount, Settings
from aigcq.platforms.base import Kind, PlatformAdapter

#: a figure of :class:`aigcq.platforms.base.Cost`
CostField = Literal["money", "coins", "seconds", "tokens", "units"]


@dataclass(frozen=True, slots=True)
class PlatformSpec:
    """One platform: its adapter (whose class says its ``name``, ``kind``, ``serves`` and
    whether it is ``paid``) and the rest of what it is."""

    adapter: type[PlatformAdapter]
    #: its real service's base URL: the default where no setting names one ("": built only
    #: where configured)
    url: str = ""
    #: the payload field naming the workflow or model a task runs ("": none)
    workflow_field: str = ""
    #: its entry in model.json (a subclass where it needs more than an apikey, listed in
    #: :data:`aigcq.config.ACCOUNT_MODELS`)
    account: type[PlatformAccount] = PlatformAccount
    #: the figures of :class:`~aigcq.platforms.base.Cost` its answers report (``units``
    #: alone: charged by the configured price per unit, ``AIGCQ_OVERFLOW_PRICE``)
    cost: tuple[CostField, ...] = ()
    #: its result files' links expire: kept in custody by default
    #: (``AIGCQ_RESULT_CUSTODY_TARGETS``)
    expiring_links: bool = False
    #: the ``aigcq emulate`` command that serves a look-alike of it ("": none, not paid)
    emulator: str = ""

    @property
    def name(self) -> str:
        return self.adapter.name

    @property
    def kind(self) -> Kind:
        return self.adapter.kind

    @property
    def paid(self) -> bool:
        return self.adapter.paid

    def base_url(self, settings: Settings) -> str:
        """Its base URL: ``AIGCQ_PLATFORM_URLS``' or its own setting's, else :attr:`url`."""
        return settings.platform_url(self.name) or self.url

    def build(self, settings: Settings) -> PlatformAdapter:
        return self.adapter(self.base_url(settings))


_SPECS: dict[str, PlatformSpec] = {}


def register(spec: PlatformSpec) -> PlatformSpec:
    """Add ``spec`` to the list (done once, by its adapter's module); a second platform of
    the same name is refused."""
    if spec.name in _SPECS:
        raise ValueError(f"a platform named {spec.name!r} is registered already")
    _SPECS[spec.name] = spec
    return spec


def specs() -> tuple[PlatformSpec, ...]:
    """Every registered platform, in the order they were registered."""
    return tuple(_SPECS.values())


def spec_of(name: str) -> PlatformSpec | None:
    return _SPECS.get(name)


def workflow_fields() -> tuple[str, ...]:
    """The payload fields that may name a task's workflow or model, first match first."""
    return tuple(dict.fromkeys(s.workflow_field for s in _SPECS.values() if s.workflow_field))


def registered() -> dict[str, type[PlatformAdapter]]:
    """Every registered adapter class by name."""
    return {spec.name: spec.adapter for spec in _SPECS.values()}
