"""Platform adapters. Importing this package registers the built-in ones."""

from aigcq.platforms import coze, message_dispatcher, runninghub

__all__ = ["coze", "message_dispatcher", "runninghub"]
