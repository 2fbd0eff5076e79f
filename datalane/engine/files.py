"""Source files through fsspec: expand URIs and globs, identify files, open them.

The identity of a file (URI, size, and the ETag or modification time its filesystem reports)
goes into the recipe fingerprint. Callers: :mod:`datalane.engine.plan` (listing),
:mod:`datalane.engine.chunks` (reading), :mod:`datalane.engine.tokenize` (tokenizer file).

**A file read is the file planned.** :func:`open_file` given a :class:`SourceFile` (what the
plan listed) compares the file it opens with it - the size, and the identity where the
filesystem reports one - once per open, and raises a :class:`DataError` naming the file, what
the plan saw and what is there now. Object stores overwrite objects in place: a file
truncated, appended to or rewritten after the plan would otherwise lose documents silently or
fail in a parsing library. Local files are checked on the open descriptor (``fstat``), remote
ones with a fresh ``info`` (a HEAD request on S3: the listing fsspec keeps from planning would
say what the plan saw).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from datalane.spec.errors import ConfigError, DataError, StorageError
from datalane.spec.formats import PROTOCOL_EXTRAS, compression_of, infer_format

__all__ = ["DirectoryLister", "SourceFile", "check_unchanged", "compression_of", "expand",
           "file_ident", "format_of", "open_file", "read_bytes"]


@dataclass(frozen=True)
class SourceFile:
    """One file of a source, as listed when the plan was made."""

    uri: str
    size: int
    ident: str  # ETag or mtime: changes when the content may have changed
    format: str
    compression: str | None


def format_of(uri: str, declared: str | None, where: str) -> str:
    """The file format: declared in the recipe, or inferred from the extension."""
    if declared is not None:
        return declared
    fmt = infer_format(uri)
    if fmt is None:
        raise ConfigError(f"{where}: cannot infer the format of {uri!r} from its extension; "
                          f"set {where}.format to 'parquet' or 'jsonl'")
    return fmt


def _fs(uri: str, where: str) -> tuple[Any, str]:
    import fsspec

    try:
        return fsspec.core.url_to_fs(uri)  # type: ignore[no-any-return]
    except (ValueError, ImportError) as e:
        extra = PROTOCOL_EXTRAS.get(uri.split("://", 1)[0].lower()) if "://" in uri else None
        hint = f" (install {extra})" if extra else ""
        raise ConfigError(f"{where} {uri!r} cannot be opened: {e}{hint}") from e


def _ident(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated"):
        if info.get(key) is not None:
            return f"{key}={info[key]}"
    return "none"


def file_ident(info: dict[str, Any]) -> str:
    """The identity of a file from what its filesystem's ``info`` reports."""
    return _ident(info)


def _unstrip(fs: Any, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return path
    return fs.unstrip_protocol(path)  # type: ignore[no-any-return]


#: Lists what a dataset directory holds (an MDS index, a Lance table, ...) as ``(filesystem
#: path, size, ident)`` entries, or None when the directory is no dataset it knows.
DirectoryLister = Callable[[Any, str], "list[tuple[str, int, str]] | None"]


def expand(uri: str, where: str,
           directory: DirectoryLister | None = None) -> list[tuple[str, int, str]]:
    """Sorted ``(uri, size, ident)`` of every file a path, glob or URI names; a directory is
    what ``directory`` lists in it (a dataset directory), or an error."""
    fs, path = _fs(uri, where)
    try:
        if any(c in path for c in "*?["):
            paths = sorted(fs.glob(path))
            if not paths:
                raise ConfigError(f"{where} {uri!r} matches no file")
        else:
            paths = [path]
        out: list[tuple[str, int, str]] = []
        for p in paths:
            info = fs.info(p)
            if info.get("type") == "directory":
                listed = directory(fs, p) if directory is not None else None
                if listed is not None:
                    out.extend((_unstrip(fs, q), size, ident) for q, size, ident in listed)
                    continue
                raise ConfigError(f"{where} {uri!r} is a directory; use a glob such as "
                                  f"'{uri.rstrip('/')}/*.parquet'")
            out.append((_unstrip(fs, p), int(info["size"]), _ident(info)))
        return out
    except FileNotFoundError as e:
        raise ConfigError(f"{where} {uri!r} does not exist") from e
    except PermissionError as e:
        raise ConfigError(f"{where} {uri!r} is not readable: permission denied") from e
    except OSError as e:
        raise StorageError(f"{where} {uri!r} cannot be listed: {e}", transient=True) from e


#: Read-ahead of a remote file read as a stream (decompression, tar members, lines): one
#: request per this many bytes. A file read in explicit ranges (``ranged=True``: token
#: windows, JSONL chunks, Parquet column chunks) has no read-ahead at all: each read is one
#: request for exactly its bytes. fsspec's own default (s3fs: 50 MiB of read-ahead) fetched
#: 50 MiB for every 1 MiB chunk a lane started, about 23 times the file's bytes.
REMOTE_STREAM_BLOCK = 4 << 20


def open_file(source: str | SourceFile, *, ranged: bool = False) -> IO[bytes]:
    """Open a source file for binary reading, as it is stored (compressed or not).

    ``source``: a URI, or the :class:`SourceFile` the plan listed - then the file opened must
    still be that file (:func:`check_unchanged`: its size, and its identity where the
    filesystem reports one), or this raises a :class:`DataError`.

    A compressed file's content is read by :func:`datalane.engine.compressed.open_content`,
    which raises a DataError for a stream cut short or corrupt (fsspec's zstd reader returns a
    shorter stream without a word). ``ranged``: the caller seeks and reads the ranges it needs
    (a remote file then fetches exactly those bytes); otherwise it reads as a stream, and a
    remote file fetches :data:`REMOTE_STREAM_BLOCK` bytes at a time."""
    import fsspec

    planned = source if isinstance(source, SourceFile) else None
    uri = source.uri if isinstance(source, SourceFile) else source
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        protocols = _protocols(fs)
        if "memory" in protocols:
            # fsspec's memory filesystem hands every reader the same file object, so two
            # readers of one file (a lane's reader and another lane opening) would move each
            # other's position; each gets a copy of its own
            data = fs.cat_file(path)
            if planned is not None:
                _compare(planned, {"size": len(data)})
            return io.BytesIO(data)
        if "file" in protocols or "local" in protocols:
            f = fs.open(path, "rb")
            if planned is not None:
                try:
                    st = os.fstat(f.fileno())
                    _compare(planned, {"size": st.st_size, "mtime": st.st_mtime})
                except BaseException:
                    f.close()
                    raise
            return f  # type: ignore[no-any-return]
        options: dict[str, Any] = ({"cache_type": "none"} if ranged else
                                   {"cache_type": "readahead", "block_size": REMOTE_STREAM_BLOCK})
        if planned is not None:
            info = _fresh_info(fs, path)
            _compare(planned, info)
            options["size"] = int(info["size"])  # the file need not ask again
        try:
            return fs.open(path, "rb", **options)  # type: ignore[no-any-return]
        except TypeError:  # a filesystem without fsspec's cache options: its own reading
            return fs.open(path, "rb")  # type: ignore[no-any-return]
    except FileNotFoundError as e:
        raise StorageError(f"source file {uri} disappeared after planning") from e
    except OSError as e:
        raise StorageError(f"cannot open {uri}: {e}", transient=True) from e


def check_unchanged(sf: SourceFile) -> None:
    """Raise a :class:`DataError` unless ``sf`` is still the file the plan listed (for files
    read without :func:`open_file`: memory-mapped indexes)."""
    fs, path = _fs(sf.uri, "source file")
    try:
        if "file" in _protocols(fs) or "local" in _protocols(fs):
            st = os.stat(path)
            _compare(sf, {"size": st.st_size, "mtime": st.st_mtime})
        else:
            _compare(sf, _fresh_info(fs, path))
    except FileNotFoundError as e:
        raise StorageError(f"source file {sf.uri} disappeared after planning") from e
    except DataError:
        raise
    except OSError as e:
        raise StorageError(f"cannot look at {sf.uri}: {e}", transient=True) from e


def _fresh_info(fs: Any, path: str) -> dict[str, Any]:
    """What the filesystem says of ``path`` now, not what it listed when the plan was made."""
    fs.invalidate_cache(path)
    return fs.info(path)  # type: ignore[no-any-return]


def _compare(sf: SourceFile, info: dict[str, Any]) -> None:
    """The size must be the planned one; the identity too when the filesystem reports the same
    kind now (an ETag against an ETag, a modification time against one)."""
    size = int(info.get("size", -1))
    ident = _ident(info)
    kind, now = sf.ident.partition("=")[0], ident.partition("=")[0]
    if size != sf.size or (ident != sf.ident and kind == now and kind != "none"):
        raise DataError(
            f"{sf.uri} changed after the plan was made: the plan saw {sf.size} bytes "
            f"({sf.ident}), the file now has {size} bytes ({ident}); a source file must not "
            f"change while a recipe reads it - make a new plan (restart) to read the new "
            f"content")


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def read_bytes(uri: str, where: str) -> bytes:
    """Whole content of a small object (tokenizer files)."""
    fs, path = _fs(uri, where)
    try:
        with fs.open(path, "rb") as f:
            return f.read()  # type: ignore[no-any-return]
    except FileNotFoundError as e:
        raise ConfigError(f"{where} {uri!r} does not exist") from e
    except IsADirectoryError as e:
        raise ConfigError(f"{where} {uri!r} is a directory; point it at tokenizer.json") from e
    except OSError as e:
        raise ConfigError(f"{where} {uri!r} cannot be read: {e}") from e
