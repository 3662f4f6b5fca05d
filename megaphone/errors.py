"""The root of megaphone's errors: every error class megaphone defines (a bad plan, a state
directory or checkpoint that is not the pipeline's, a lost lease, a store that failed ...)
derives from :class:`MegaphoneError`, so ``except MegaphoneError`` catches what the library
reports about plans, state and stores. Each also keeps its builtin base (``ValueError`` for bad
input, ``RuntimeError`` for a failed operation), so existing handlers keep working. A plain
wrong argument (a negative count, an unknown option) raises the builtin ``ValueError`` or
``TypeError`` directly, as the standard library does."""

from __future__ import annotations


class MegaphoneError(Exception):
    """Base of every error class megaphone defines."""
