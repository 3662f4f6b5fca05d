"""Shared fixtures: one embedded SparkSession for the whole test session."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("MEGAPHONE_HYPOTHESIS_MAX", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession every Spark test shares (local[2], small shuffles)."""
    from megaphone.spark import spark_session

    session = spark_session("local[2]", "megaphone-tests")
    yield session
    session.stop()
