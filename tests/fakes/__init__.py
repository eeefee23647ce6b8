"""What the tests share, one module per concept; test modules import from here, never from
each other. ``waiting`` (wait on a condition, not a sleep), ``servers`` (serve an app on a
bound socket, record requests), ``snapshot`` (all of Redis, for "changes nothing"),
``service`` (``aigcq serve`` in-process), ``paid`` (serve with recording paid-platform
emulators), ``processes`` (real ``aigcq`` processes), ``browser`` (headless Chromium),
``fault_proxy`` (a TCP proxy that loses replies)."""
