"""Start and stop the servers some tests need (a Spark Connect server, a standalone cluster):
on 127.0.0.1, in their own process groups, so only what a test started is stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in a new session (its own process group), output to ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Wait until something listens on ``port``; fail with the log if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name} exited: {log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing on port {port} after {timeout:.0f} s: "
                                   f"{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop the process groups of ``procs`` (SIGTERM, then SIGKILL after 30 s)."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def s3_endpoint(bucket: str) -> Iterator[Callable[[str], str]]:
    """An S3-compatible endpoint (moto's server) on 127.0.0.1 with ``bucket``, for the test's
    duration (named ``bucket-<random>``); yields ``uri(path)``: the URI of
    ``s3://bucket/path`` with the endpoint and the test credentials."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    bucket = f"{bucket}-{uuid.uuid4().hex[:12]}"  # moto keeps buckets across servers in a process
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        pafs.S3FileSystem(access_key="testing", secret_key="testing", scheme="http",
                          endpoint_override=f"{host}:{port}", region="us-east-1",
                          allow_bucket_creation=True).create_dir(bucket)
        yield lambda path: (f"s3://testing:testing@{bucket}/{path}?endpoint_override="
                            f"{host}:{port}&scheme=http&region=us-east-1")
    finally:
        server.stop()
