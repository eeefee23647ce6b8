"""Platform adapters. Importing this package registers the built-in ones."""

from aigcq.platforms import coze, runninghub

__all__ = ["coze", "runninghub"]
