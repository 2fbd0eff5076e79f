"""Structured (JSON lines) logs on stderr, with no credential material at any level.

Every line goes through :class:`Redactor` before it is written: the exact values of the
credentials the sidecar was given (``AWS_*`` environment variables, the ``key``/``secret``/
``token`` of ``--store-options``) and the shapes credentials take in library debug output
(AWS access key ids, SigV4 ``Credential=``/``Signature=``, ``X-Amz-Security-Token``) become
``<redacted>``. The storage libraries' own loggers (botocore, s3fs, fsspec, urllib3, ...) are
capped at INFO, so ``--log-level debug`` does not print a signed request per S3 call.

Caller: ``datalane-sidecar serve`` (:mod:`datalane_sidecar.cli`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Redactor", "credentials_in", "setup_logging"]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
REDACTED = "<redacted>"
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                  "AWS_SECURITY_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS_JSON")
# fsspec/s3fs/gcsfs option names whose values are credentials
CREDENTIAL_OPTIONS = frozenset({
    "key", "secret", "token", "password", "access_key", "secret_key", "session_token",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "account_key",
    "sas_token", "client_secret"})
NOISY_LIBRARIES = ("botocore", "boto3", "s3transfer", "aiobotocore", "s3fs", "fsspec",
                   "gcsfs", "google", "urllib3", "aiohttp")
_MIN_SECRET = 6  # shorter values would redact ordinary words
_SHAPES = (
    re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA|APKA)[A-Z0-9]{16}\b"),
    re.compile(r"(?<=Credential=)[^/\s,'\"&]+"),
    re.compile(r"(?<=Signature=)[0-9a-fA-F]{16,}"),
    re.compile(r"(?i)(?<=x-amz-security-token)(['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,&}]+"),
)


def credentials_in(options: Any) -> list[str]:
    """The string values of credential-named keys anywhere in fsspec ``options``."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for k, v in options.items():
            if isinstance(v, str) and str(k).lower() in CREDENTIAL_OPTIONS:
                found.append(v)
            else:
                found.extend(credentials_in(v))
    elif isinstance(options, (list, tuple)):
        for v in options:
            found.extend(credentials_in(v))
    return found


class Redactor:
    """Replace known credential values and credential shapes in a text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= _MIN_SECRET}
        values |= {json.dumps(s)[1:-1] for s in values}  # as they appear inside JSON
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        for shape in _SHAPES:
            if shape.groups:
                text = shape.sub(lambda m: m.group(1) + REDACTED, text)
            else:
                text = shape.sub(REDACTED, text)
        return text


class JsonFormatter(logging.Formatter):
    def __init__(self, redact: Redactor | None = None) -> None:
        super().__init__()
        self.redact = redact or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
               "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return self.redact(json.dumps(out, default=str))


def setup_logging(level: str = "info", store_options: Mapping[str, Any] | None = None) -> None:
    """JSON lines on stderr at ``level``, redacting the credentials of the environment and of
    ``store_options``; the storage libraries log at INFO at the most verbose."""
    secrets = [os.environ[name] for name in CREDENTIAL_ENV if os.environ.get(name)]
    secrets += credentials_in(store_options or {})
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(Redactor(secrets)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    cap = max(root.level, logging.INFO)
    for name in NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(cap)
