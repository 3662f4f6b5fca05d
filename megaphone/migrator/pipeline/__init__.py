"""The public :class:`~megaphone.migrator.pipeline.facade.Pipeline` and what runs it on
Structured Streaming and Spark Connect, and the user-level helpers ``Chain`` and
``join_input``. The highest room of :mod:`megaphone.migrator`."""

from megaphone.migrator.pipeline.facade import Pipeline

__all__ = ["Pipeline"]
