"""The errors of routing and the state backends share the root MegaphoneError and keep their
builtin base, so both ``except MegaphoneError`` and older ``except ValueError/RuntimeError``
clauses catch them."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from megaphone.errors import MegaphoneError
from megaphone.routing.fingerprint import FingerprintMismatch
from megaphone.state_backends.durable import DurableCopyError
from megaphone.state_backends.remote import StoreError, StoreUnavailable
from megaphone.state_backends.service import LeaseLost
from megaphone.state_backends.worker_store import StoreVersionError


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (FingerprintMismatch, ValueError),
        (DurableCopyError, RuntimeError),
        (StoreError, RuntimeError),
        (StoreUnavailable, RuntimeError),
        (LeaseLost, RuntimeError),
        (StoreVersionError, RuntimeError),
    ],
)
def test_error_has_megaphone_root_and_builtin_base(cls: type, builtin: type) -> None:
    assert issubclass(cls, MegaphoneError)
    assert issubclass(cls, builtin)
    with pytest.raises(MegaphoneError, match="boom"):
        raise cls("boom")


@pytest.mark.parametrize("package", ["megaphone.routing", "megaphone.state_backends"])
def test_every_error_defined_in_the_package_has_the_root(package: str) -> None:
    """No module of routing or state_backends defines an error outside the hierarchy."""
    pkg = importlib.import_module(package)
    found = []
    for info in pkgutil.iter_modules(pkg.__path__, f"{package}."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseException) \
                    and obj.__module__ == module.__name__:
                found.append(obj)
                assert issubclass(obj, MegaphoneError), obj
    assert found


def test_an_epoch_job_is_rerun_after_a_lost_store_or_a_lost_executor_only():
    """The soak found Spark failing an epoch's job after an executor loss ("indeterminate
    output": some result tasks had finished); the epoch is idempotent, so it runs again."""
    from megaphone.migrator.epoch.spark_job import retryable

    lost_executor = ("Job aborted due to stage failure: A shuffle map stage with indeterminate "
                     "output was failed and retried. However, Spark cannot rollback the "
                     "ResultStage 5 to re-process the input data, and has to fail this job.")
    assert retryable(lost_executor)
    assert retryable("megaphone...StoreUnavailable: the store service at /x did not answer")
    assert not retryable("ValueError: keys must be integers")
    assert not retryable("update function failed on key 1 at epoch 2: it raised: KeyError")
