"""A sidecar service served in the test's own process, for tests that reach into it, and a
tiny recipe for sessions driven in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from datalane import load_recipe
from datalane.corpus import tokenizer_path
from datalane.spec.recipe import Recipe
from datalane.wire import datalane_pb2_grpc as pbg


def tiny_recipe(root: Path) -> Recipe:
    """An endless 4-lane recipe over 4 small JSONL files in ``root``: a global batch of 8
    sequences of 32 tokens (at world size 1 with microbatches of 4, a step is 2 of them).
    Planned in milliseconds, for tests that drive sessions in their own process."""
    for i in range(4):
        (root / f"f{i}.jsonl").write_text("".join(
            json.dumps({"text": f"doc {j} of file {i} " + "abc def ghi " * (j % 7 + 1)}) + "\n"
            for j in range(40)))
    return load_recipe({
        "lanes": 4, "global_batch_size": 8, "seq_len": 32, "seed": 3,
        "tokenizer": {"uri": tokenizer_path()},
        "sources": [{"name": "tiny", "uris": [str(root / "*.jsonl")], "epochs": None}],
        "shuffle": {"block_size": 16}})


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
