"""A loopback TCP spreader: what a Service does for the API server's webhook calls.

The chart's webhooks reach the operator through a Service over every ready replica. The test
control plane runs the replicas as local processes, and the API server refuses loopback
addresses as a Service's endpoints, so the webhook URL points at this spreader instead: each
connection goes to the next replica in turn, skipping one that refuses the connection (a
replica that is down), and is closed at once when none accepts (a Service without ready
endpoints). TLS passes through untouched, so the API server still checks the operator's own
certificate. Counts connections per replica, so a test can see that both served.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Sequence

__all__ = ["Spreader"]


class Spreader:
    """Listen on ``127.0.0.1:port``; forward each connection to one of ``backends`` (ports)."""

    def __init__(self, port: int, backends: Sequence[int]) -> None:
        self.port = port
        self.backends = list(backends)
        self.served: Counter[int] = Counter()  # connections forwarded, per backend port
        self.refused = 0  # connections no backend accepted
        self._next = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spreader", daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> Spreader:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the spreader did not listen on 127.0.0.1:{self.port}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            pending = asyncio.all_tasks(self._loop)  # connections still piping
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        start = next(self._next)
        for i in range(len(self.backends)):
            port = self.backends[(start + i) % len(self.backends)]
            try:
                pair = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            except (OSError, TimeoutError):
                continue
            self.served[port] += 1
            return pair
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            self.refused += 1
            writer.close()
            return
        up_reader, up_writer = upstream

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
