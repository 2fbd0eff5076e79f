"""Atomic object I/O with retries: the one place the store touches a filesystem.

:class:`ObjectIO` wraps an fsspec filesystem rooted at the store's base path and offers the
few verbs the checkpoint store needs - read, write, list, delete - with two guarantees:

* **Nothing partial under a final name.** On a local filesystem an object is written to
  ``<name>.tmp-<random>``, fsynced and moved over the final name with ``os.replace`` (atomic
  on POSIX). On an object store (``s3://``, ``gs://``, ``memory://``, ...) the final name is
  written with a single PUT, which the store applies atomically; no temporary object and no
  copy. Every write is read back and compared byte for byte, so a body truncated in transit
  is caught and written again.
* **Errors with meaning.** Transient failures (timeouts, dropped connections, HTTP 5xx and
  throttling, ``EIO``) are retried with exponential backoff up to ``retries`` times and then
  raised as ``StorageError(transient=True)``; permanent ones (missing object, permission,
  bad request) are raised at once as ``StorageError(transient=False)``. Both name the object
  by URI and chain the original exception. A deleted bucket is named as such, never taken
  for a missing object (which reads as "no checkpoint yet").

Dependencies: fsspec and the standard library only; botocore errors are recognised by their
response fields and class names, not imported. Callers: :mod:`datalane.store.store`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from fsspec.implementations.local import LocalFileSystem

from datalane.spec.errors import ConfigError, DatalaneError, StorageError

__all__ = ["FileSystem", "ObjectIO", "TornWriteError", "is_transient"]

log = logging.getLogger("datalane.store")

T = TypeVar("T")


class FileSystem(Protocol):
    """The part of the fsspec ``AbstractFileSystem`` interface the store uses."""

    def cat_file(self, path: str) -> bytes: ...

    def pipe_file(self, path: str, value: bytes) -> Any: ...

    def find(self, path: str) -> Any: ...

    def rm(self, path: str | list[str], recursive: bool = False) -> Any: ...

    def invalidate_cache(self, path: str | None = None) -> Any: ...


class TornWriteError(OSError):
    """A written object read back different from what was written (retried as transient)."""


_PERMANENT_TYPES = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                    FileExistsError)
_PERMANENT_ERRNOS = frozenset({
    errno.ENOENT, errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENAMETOOLONG, errno.EEXIST,
    errno.EISDIR, errno.ENOTDIR, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ENOSYS,
})
# S3 error codes worth another try (the rest of 4xx is permanent).
_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
    "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "PriorRequestNotComplete", "OperationAborted",
})
# Connection-level errors of botocore, aiohttp and fsspec, matched by class name so that the
# store needs none of those packages.
_TRANSIENT_TYPE_NAMES = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "HTTPClientError", "ResponseParserError", "IncompleteReadError",
    "ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError",
    "ClientOSError", "FSTimeoutError", "IncompleteRead",
})


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 8:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _http_verdict(exc: BaseException) -> bool | None:
    """Transient (True) or permanent (False) from a botocore-style ``response``; None if absent."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = error.get("Code") if isinstance(error, dict) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
    if code in _TRANSIENT_CODES:
        return True
    if isinstance(status, int):
        return status >= 500 or status == 429
    return None if code is None else False


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the operation that raised ``exc`` may succeed."""
    if isinstance(exc, TornWriteError):
        return True
    for e in _causes(exc):
        verdict = _http_verdict(e)
        if verdict is not None:
            return verdict
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if any(c.__name__ in _TRANSIENT_TYPE_NAMES for c in type(exc).__mro__):
        return True
    if isinstance(exc, OSError):
        return exc.errno not in _PERMANENT_ERRNOS
    return False


def missing_bucket(exc: BaseException) -> str | None:
    """The bucket named by an S3 ``NoSuchBucket`` error in ``exc``'s causes, else None.

    s3fs reports a deleted bucket as a plain FileNotFoundError, like a missing object; only
    the botocore cause tells them apart."""
    for e in _causes(exc):
        response = getattr(e, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        if isinstance(error, dict) and error.get("Code") == "NoSuchBucket":
            return str(error.get("BucketName") or "?")
    return None


def _absent(exc: FileNotFoundError) -> FileNotFoundError:
    """``exc`` if it means "no such object" (an answer); raised again if the bucket is gone."""
    if missing_bucket(exc) is not None:
        raise exc
    return exc


def _describe(exc: BaseException) -> str:
    bucket = missing_bucket(exc)
    if bucket is not None:
        return f"the bucket {bucket!r} does not exist (deleted, or a typo in the URI?)"
    if isinstance(exc, FileNotFoundError):
        return "the object does not exist"
    if isinstance(exc, PermissionError):
        return f"permission denied ({exc})"
    text = str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


def _write_local(path: str, data: bytes) -> None:
    """Temp file + fsync + ``os.replace``: readers see the old object or the whole new one."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable; not every FS allows it
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ObjectIO:
    """Reads and writes objects under ``base_path`` of ``fs`` with retries and atomic writes.

    ``base_uri`` is the user-facing form of ``base_path`` (with its protocol); every error
    names objects by ``base_uri`` + the path below the base.
    """

    def __init__(self, fs: FileSystem, base_path: str, base_uri: str, *, retries: int = 3,
                 backoff: float = 0.2) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be a non-negative integer, got {retries!r}")
        self.fs = fs
        self.base_path = base_path.rstrip("/")
        self.base_uri = base_uri.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.local = isinstance(fs, LocalFileSystem)

    def uri(self, path: str) -> str:
        """The user-facing URI of ``path`` (a path under the base)."""
        if path == self.base_path or path.startswith(self.base_path + "/"):
            return self.base_uri + path[len(self.base_path):]
        return path

    def _call(self, verb: str, path: str, fn: Callable[[], T]) -> T:
        attempts = self.retries + 1
        for attempt in range(attempts):
            try:
                return fn()
            except DatalaneError:
                raise
            except Exception as e:
                if not is_transient(e):
                    raise StorageError(f"cannot {verb} {self.uri(path)}: {_describe(e)}",
                                       transient=False) from e
                if attempt + 1 == attempts:
                    raise StorageError(
                        f"cannot {verb} {self.uri(path)}: {_describe(e)} (transient; gave up "
                        f"after {attempts} attempts)", transient=True) from e
                delay = min(self.backoff * 2**attempt, 10.0) * random.uniform(0.5, 1.0)
                log.warning("transient error on %s %s (attempt %d of %d, retrying in %.2fs): %s",
                            verb, self.uri(path), attempt + 1, attempts, delay, _describe(e))
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def read(self, path: str) -> bytes:
        """The bytes of the object at ``path``; StorageError if it is missing or unreadable."""
        return self._call("read", path, lambda: bytes(self.fs.cat_file(path)))

    def read_optional(self, path: str) -> bytes | None:
        """The bytes of the object at ``path``, or None if it does not exist."""
        def attempt() -> bytes | None:
            try:
                return bytes(self.fs.cat_file(path))
            except FileNotFoundError as e:
                _absent(e)
                return None
        return self._call("read", path, attempt)

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path`` atomically, read it back and retry until it matches."""
        def attempt() -> None:
            if self.local:
                _write_local(path, data)
            else:
                self.fs.pipe_file(path, data)  # one PUT of the final name
            try:
                back = bytes(self.fs.cat_file(path))
            except FileNotFoundError as e:
                # gone right after our PUT succeeded: another writer's PUT of the same name is
                # in flight (S3-compatible stores may show no object meanwhile); write again
                raise TornWriteError(errno.EIO, "the object was missing when read back right "
                                     "after it was written") from e
            if back != data:
                raise TornWriteError(
                    errno.EIO, f"read back {len(back)} bytes that differ from the {len(data)} "
                    f"bytes written")
        self._call("write", path, attempt)

    def list_files(self, prefix: str) -> list[str]:
        """Every object path under ``prefix`` (recursive, fresh from the store, sorted)."""
        def attempt() -> list[str]:
            with contextlib.suppress(Exception):  # drop fsspec's listing cache; best effort
                self.fs.invalidate_cache(prefix)
            try:
                found = self.fs.find(prefix)
            except FileNotFoundError as e:
                _absent(e)
                return []
            return sorted(str(p).rstrip("/") for p in found)
        return self._call("list", prefix, attempt)

    def delete(self, path: str) -> None:
        """Delete one object; a missing object is not an error."""
        def attempt() -> None:
            try:
                self.fs.rm(path)
            except FileNotFoundError as e:
                _absent(e)
        self._call("delete", path, attempt)

    def delete_tree(self, prefix: str) -> None:
        """Delete every object under ``prefix`` (and the directory, where there is one)."""
        def attempt() -> None:
            try:
                self.fs.rm(prefix, recursive=True)
            except FileNotFoundError as e:
                _absent(e)
        self._call("delete", prefix, attempt)
