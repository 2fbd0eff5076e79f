"""The operator's background loops, started by the kopf startup handlers
(:mod:`datalane_operator.handlers`) as tasks of the runtime.

* :func:`storage_loop`: every ``storage_interval``, the leader looks at every indexed
  pipeline's checkpoint store (:meth:`~datalane_operator.runtime.Runtime.look`);
* :func:`ca_loop`: every ``ca_interval``, keep the webhook configurations' ``caBundle`` equal
  to the mounted ``ca.crt`` (a renewed CA reaches the API server without a restart).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datalane_operator.runtime import Runtime

__all__ = ["ca_loop", "storage_loop"]

log = logging.getLogger("datalane.operator")


async def storage_loop(rt: Runtime, pipelines: Any) -> None:
    """``pipelines``: kopf's index of DataPipelines by (namespace, workload)."""
    while True:
        await asyncio.sleep(rt.config.storage_interval)
        if not rt.leading:
            continue
        for (namespace, _job), store in list(pipelines.items()):
            for found in store:
                rt.look((namespace, found["metadata"]["name"]))


async def ca_loop(rt: Runtime) -> None:
    while True:
        try:
            pem = Path(rt.config.ca_file).read_bytes()
            done = await rt.k().patch_ca_bundle(rt.config.webhook_configuration, pem)
            if done:
                log.info("caBundle set in %s", ", ".join(done))
        except Exception as e:
            log.warning("cannot set the caBundle of %s: %s", rt.config.webhook_configuration, e)
        await asyncio.sleep(rt.config.ca_interval)
