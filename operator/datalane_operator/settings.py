"""kopf's settings for this operator, applied by the startup handler
(:func:`datalane_operator.handlers.configure`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import kopf

from datalane_operator.logfilter import RefusalsAreInfo
from datalane_operator.names import GROUP

if TYPE_CHECKING:
    from datalane_operator.runtime import Runtime

__all__ = ["configure"]


def configure(settings: kopf.OperatorSettings, rt: Runtime) -> None:
    """Persistence under our group (kopf's changing handlers are never used), events at
    WARNING, bounded watches, no kopf-managed webhook configurations (the Helm chart owns
    them), and the webhook server on the configured address with timed reviews."""
    from datalane_operator.webhooks import TimedWebhookServer

    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"  # never added: no handler needs it
    settings.posting.level = logging.WARNING  # our own events say what happened
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, RefusalsAreInfo) for f in objects.filters):
        objects.addFilter(RefusalsAreInfo())
    # Watches end server-side after a bounded time and are re-established; a stream that
    # goes silent (no event, no bookmark) is dropped after inactivity_timeout.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = 70
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.admission.managed = None  # the Helm chart owns the webhook configurations
    cfg = rt.config
    settings.admission.server = TimedWebhookServer(
        addr=cfg.webhook_addr, port=cfg.webhook_port, host=cfg.webhook_host,
        certfile=cfg.tls_cert, pkeyfile=cfg.tls_key, cafile=cfg.ca_file or None, runtime=rt)
