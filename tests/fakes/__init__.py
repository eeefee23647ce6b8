"""What the tests share, one module per concept; test modules import from here (and from
pytest's conftest fixtures), never from each other.

- ``waiting``: ``wait_until`` / ``until`` — wait on a condition, not a fixed sleep
- ``servers``: serve an ASGI app on a socket bound first; record requests; a closed port
- ``snapshot``: all of Redis, to check that a refused request changed nothing
- ``client``: a business backend on the client WebSocket, and the frames it sends
- ``bridge``: a bridge speaking the hub protocol over websockets, and its TASK_END
- ``service``: ``aigcq serve`` in-process (the ``env`` fixture), with RunningHub behind it
- ``gateway``: the client tokens of the gateway tests
- ``message_dispatcher``: ``aigcq dispatcher`` in-process (``md``) and serve in front of it
- ``paid``: serve with recording RunningHub and Coze emulators (the paid-fault tests)
- ``asynch``: model-asynch in-process on PostgreSQL, and a stand-in for its overview
- ``comfyui``: workflows the ComfyUI emulator runs, and a PNG reader
- ``agent``: settings of our reference bridge for tests
- ``processes``: real ``aigcq`` processes (``Cluster``) for the e2e tests and benches
- ``cli``: checks on a command run with CliRunner
- ``browser``: headless Chromium over the DevTools protocol
- ``fault_proxy``: a TCP proxy that loses replies on purpose
"""
