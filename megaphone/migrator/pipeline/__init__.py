"""The public :class:`~megaphone.migrator.pipeline.facade.Pipeline` and what runs it on
Structured Streaming and Spark Connect, ``migrate``, ``rescale`` and ``Chain``. The highest
room of :mod:`megaphone.migrator`."""

from megaphone.migrator.pipeline.facade import Pipeline

__all__ = ["Pipeline"]
