"""Review finding 7, the operator's side: a checkpoint store that hangs must not take the
threads of the operator's kube calls.

The store looks ran on asyncio's default executor (``asyncio.to_thread``), where the kube
client's calls (``Kube._call``: statuses, events, the Lease's renewal in ``leader.py``) run
too. ``asyncio.wait_for`` ended the look's wait at ``storage_timeout``, never its thread: each
look of a store that never answers kept one thread of that executor, and once they were all
held no API call of the operator ran again. The looks now run on the runtime's own bounded
pool (``Runtime.store_calls``).

The store's listing hangs on an Event the test holds (as an S3 endpoint that stops
answering); the default executor is made two threads wide so that the old code runs out of it
within a few looks on any machine.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from datalane_operator.kube import Kube
from datalane_operator.pipeline import load_pipeline
from datalane_operator.policy import Policy
from datalane_operator.reconciler import look_at_store, store_progress
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.storage import Listing, StoreView

from .builders import dp


def test_looks_at_a_hanging_store_leave_the_kube_calls_their_threads(tmp_path: Path,
                                                                     monkeypatch) -> None:
    answer = threading.Event()
    hung: list[str] = []

    def hangs(name: str) -> Any:
        def call(self: StoreView, *args: Any, **kwargs: Any) -> Any:
            hung.append(name)
            answer.wait(60)
            return Listing(self.uri) if name == "look" else (None, "")
        return call

    monkeypatch.setattr(StoreView, "look", hangs("look"))
    monkeypatch.setattr(StoreView, "newest", hangs("newest"))
    body = dp(checkpoint={"uri": str(tmp_path / "store"), "keep": 2})
    rt = Runtime(OperatorConfig(policy=Policy(allow_operator_identity=True),
                                storage_timeout=0.3))
    kube = Kube(api_client=object())

    async def main() -> tuple[list[str], str, str]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        try:
            errors = [(await look_at_store(rt, load_pipeline(body))).error for _ in range(4)]
            progress = await store_progress(rt, body)
            # a kube call, as every read, patch, event and Lease renewal makes it
            renewed = await asyncio.wait_for(kube._call(lambda **kw: "lease renewed"), 10)
            return errors, str(progress.error), renewed
        finally:
            answer.set()

    errors, progress, renewed = asyncio.run(main())
    assert errors == ["no answer within 0 s"] * 4
    assert progress == "no answer within 0 s"
    assert renewed == "lease renewed"
    # the pool's threads (4) hung on the first looks; the calls queued behind them were
    # dropped when their wait ended, never run
    assert hung == ["look"] * 4
