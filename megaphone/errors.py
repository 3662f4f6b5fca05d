"""The root of megaphone's errors: every error megaphone raises on purpose derives from
:class:`MegaphoneError`, so ``except MegaphoneError`` catches what the library reports and
nothing else. Each error also keeps the builtin base it had (``ValueError`` for bad input,
``RuntimeError`` for a failed operation), so existing handlers keep working."""

from __future__ import annotations


class MegaphoneError(Exception):
    """Base of every error megaphone raises on purpose."""
