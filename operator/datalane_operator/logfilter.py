"""A log filter for kopf's logs: a refused admission is the webhook working, not an error.

Installed on ``kopf.objects`` by :func:`datalane_operator.settings.configure`.
"""

from __future__ import annotations

import logging

from datalane_operator.names import WEBHOOKS

__all__ = ["RefusalsAreInfo"]


class RefusalsAreInfo(logging.Filter):
    """kopf logs every refused admission (``AdmissionError``) at ERROR, as a handler that
    "failed permanently"; a refusal is the webhook working, so it is logged at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR:
            msg = record.getMessage()
            if any(msg.startswith(f"Webhook {w!r} failed permanently: ") for w in WEBHOOKS):
                record.msg, record.args = f"refused: {msg.split(': ', 1)[1]}", ()
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True
