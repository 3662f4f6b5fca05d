"""The package version, kept in one place for pyproject and ``megaphone --version``."""

__version__ = "0.1.0"
