"""The store service's process: it serves a host's socket until idle, orphaned or shut down.

It runs housekeeping every half second and exits when it has been idle long enough or when the
executors using it are gone.

Started by the client (:mod:`megaphone.state_backends.remote`) as
``python -m megaphone.state_backends.service_process DIR``; the requests themselves are answered
by :class:`~megaphone.state_backends.service.StoreService`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socketserver
import sys
import threading

import pyarrow as pa

from megaphone.paths import host_dir_of, store_pid_path, store_socket_path
from megaphone.state_backends.service import IDLE_EXIT_S, StoreService

log = logging.getLogger("megaphone.store_service")


def run(local_dir: str, idle_exit_s: float = IDLE_EXIT_S,
        starter: tuple[int, int] | None = None) -> None:
    """Serve ``local_dir``'s socket until shut down, idle, or the executors using it are gone;
    ``starter`` (pid, start time) is the process that started it, watched from the start as
    if it had already connected."""
    # pyarrow imports pandas at its first conversion of Python or numpy data (0.3-0.4 s here);
    # made before the service listens, it no longer slows the first epoch that exports a bin.
    pa.array([0])
    service = StoreService(idle_exit_s, host_dir_of(local_dir))
    if starter is not None:
        service.watched.add(starter)
    path = store_socket_path(local_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # the caller holds the start lock: no live service owns it

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            service.serve(self.request)

    class Server(socketserver.ThreadingUnixStreamServer):
        daemon_threads = True
        request_queue_size = 64

    server = Server(path, Handler)
    os.chmod(path, 0o600)
    with open(store_pid_path(local_dir) + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(store_pid_path(local_dir) + ".tmp", store_pid_path(local_dir))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                     daemon=True).start()
    log.info("store service %d listening on %s", os.getpid(), path)
    try:
        while service.housekeeping():
            service.stopping.wait(0.5)
    finally:
        server.shutdown()
        if service.network is not None:
            service.network.close()
        service.close_stores(lambda p, e: True, "service stopping")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info("store service %d stopped", os.getpid())


def main(argv: list[str] | None = None) -> None:
    """Command-line entry of the service process (started by the client)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("local_dir")
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT_S)
    parser.add_argument("--watch", metavar="PID:START", default=None,
                        help="the starter's pid and start time (clock ticks since boot)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(message)s")
    starter = None
    if args.watch is not None:
        pid, _, start = args.watch.partition(":")
        # a starter already gone has no start time: one that cannot match any process
        starter = (int(pid), int(start) if start.isdigit() else -1)
    run(args.local_dir, args.idle_exit, starter)


if __name__ == "__main__":
    main()
