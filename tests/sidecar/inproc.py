"""A sidecar service served in the test's own process, for tests that reach into it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from datalane.wire import datalane_pb2_grpc as pbg


@contextmanager
def serve_in_process(service: Any, directory: str | Path) -> Iterator[str]:
    """Serve ``service`` (a ``DataLaneService``) on a Unix socket in ``directory``; yields the
    socket path, then stops the server and the service's worker pool."""
    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    pbg.add_DataLaneServicer_to_server(service, server)
    sock = str(Path(directory) / "dl.sock")
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        yield sock
    finally:
        server.stop(0)
        service.pool.shutdown(wait=False)
