"""A fault-injecting wrapper around a real fsspec filesystem (s3fs in the tests).

``FaultyFS(inner)`` forwards every call to ``inner`` and, for the calls named in its plan,
raises what s3fs would raise on a real S3 failure or stores a truncated body instead::

    fs = FaultyFS(real_s3fs)
    fs.on("pipe_file", 2, "server_error")     # the 2nd PUT answers 503 Slow Down
    store = CheckpointStore(uri, options, filesystem=fs)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from s3fs.errors import translate_boto_error

KINDS = ("server_error", "internal_error", "read_timeout", "connection_dropped",
         "timeout_after_write", "truncate")


def _client_error(code: str, status: int, message: str, op: str) -> BaseException:
    err = ClientError({"Error": {"Code": code, "Message": message},
                       "ResponseMetadata": {"HTTPStatusCode": status}}, op)
    return translate_boto_error(err)  # exactly what s3fs raises for this response


def make_fault(kind: str, op: str = "PutObject") -> BaseException:
    """The exception a real S3 client sees for a fault of ``kind``."""
    if kind == "server_error":
        return _client_error("SlowDown", 503, "Please reduce your request rate.", op)
    if kind == "internal_error":
        return _client_error("InternalError", 500, "We encountered an internal error.", op)
    if kind == "access_denied":
        return _client_error("AccessDenied", 403, "Access Denied", op)
    if kind in ("read_timeout", "timeout_after_write"):
        return ReadTimeoutError(endpoint_url="http://127.0.0.1/bucket/key")
    if kind == "connection_dropped":
        return EndpointConnectionError(endpoint_url="http://127.0.0.1/bucket/key")
    raise ValueError(f"unknown fault kind {kind!r}")


class FaultyFS:
    """Delegates to ``inner``; the ``n``-th call of a planned method fails as planned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.plan: dict[tuple[str, int], str] = {}
        self.always: dict[str, str] = {}
        self.injected: list[tuple[str, int, str, str]] = []

    def on(self, method: str, nth: int, kind: str) -> FaultyFS:
        """Fail the ``nth`` call (1-based) of ``method`` with a fault of ``kind``."""
        self.plan[(method, nth)] = kind
        return self

    def always_fail(self, method: str, kind: str) -> FaultyFS:
        self.always[method] = kind
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _fault(self, method: str, path: str) -> str | None:
        self.calls[method] += 1
        kind = self.plan.pop((method, self.calls[method]), None) or self.always.get(method)
        if kind is not None:
            self.injected.append((method, self.calls[method], kind, path))
        return kind

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> Any:
        kind = self._fault("pipe_file", path)
        if kind is None:
            return self.inner.pipe_file(path, value, **kwargs)
        if kind == "truncate":  # the PUT "succeeds" with half the body
            return self.inner.pipe_file(path, value[: len(value) // 2], **kwargs)
        if kind == "timeout_after_write":  # the object landed, the answer was lost
            self.inner.pipe_file(path, value, **kwargs)
        raise make_fault(kind, "PutObject")

    def cat_file(self, path: str, **kwargs: Any) -> Any:
        kind = self._fault("cat_file", path)
        if kind is None or kind == "truncate":
            data = self.inner.cat_file(path, **kwargs)
            return data if kind is None else data[: len(data) // 2]
        if kind == "missing":  # NoSuchKey, as s3fs raises it
            raise FileNotFoundError(path)
        raise make_fault(kind, "GetObject")

    def find(self, path: str, **kwargs: Any) -> Any:
        kind = self._fault("find", path)
        if kind is not None:
            raise make_fault(kind, "ListObjectsV2")
        return self.inner.find(path, **kwargs)
