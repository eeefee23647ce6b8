"""Platform adapters. Importing this package registers the built-in ones."""

from aigcq.platforms import coze, jimuai, message_dispatcher, runninghub

# isort: split
# registered last: an opt-in target, first only where configured (serve.server.build_adapters)
from aigcq.platforms import comfy_v2

__all__ = ["comfy_v2", "coze", "jimuai", "message_dispatcher", "runninghub"]
