"""Platform adapters. Importing this package registers the built-in ones, in this order:
the order of :func:`aigcq.platforms.registry.specs` and of the lists read from it."""

from aigcq.platforms import runninghub

# isort: split
# (message_dispatcher imports runninghub: it would be registered after coze and jimuai)
from aigcq.platforms import coze, jimuai, message_dispatcher

# isort: split
# registered last: an opt-in target, first only where configured (serve.server.build_adapters)
from aigcq.platforms import comfy_v2

__all__ = ["comfy_v2", "coze", "jimuai", "message_dispatcher", "runninghub"]
