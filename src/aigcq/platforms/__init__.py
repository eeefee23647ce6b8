"""Platform adapters. Importing this package registers the built-in ones."""

from aigcq.platforms import coze, jimuai, message_dispatcher, runninghub

__all__ = ["coze", "jimuai", "message_dispatcher", "runninghub"]
