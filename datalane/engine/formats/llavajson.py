"""LLaVA records: a JSON file holding a list of them (or JSONL, one a line), each naming its
images by paths relative to the file's folder (docs/vlm.md, LLaVA JSON).

:class:`LlavaJson` is the JSON format's configured copy for a ``llava`` source
(:meth:`~datalane.engine.formats.jsonl.Jsonl.for_source`). A file whose first byte that is not
whitespace is ``[`` is one array, read an element at a time (:mod:`.jsonarray`); any other
is JSONL, read as the JSON format reads it. Either way a record's position is the byte offset
of its first byte.

The reader gives each record with the file it came from (:class:`Located`), because decoding it
reads the images it names - on the worker threads, as every decode runs - and a format's
``decode`` is given the record alone. A path is refused, before anything is read, as a bad
record ``image_path`` when it is not a non-empty string, is absolute, is a URI (its first
component holds ``:``), holds a backslash, a NUL or a ``..`` component, holds ``%``, ``?`` or
``#`` on a filesystem that is not local (a URL would decode ``%2e%2e/`` to ``../``), or - on a
local filesystem - leads outside the JSON file's folder once symlinks are resolved (the
folder's own symlinks resolved too: the folder is the root). A path to nothing (or to a
directory) is ``image_missing``, and so is a path through a file (``ok.png/x.png``); a path the
filesystem cannot follow (a component too long, a loop of symlinks) or that is not valid
Unicode (a lone surrogate) is ``image_path``. A file over the source's ``limits.max_bytes`` is
``image_too_large``, known from its size before it is read, and at most ``max_bytes + 1`` bytes
are ever read. A record naming more than ``max_images`` images is ``too_many_images`` before
any is read; an ``image`` that is neither a path nor a list of paths is ``malformed_sample``; a
record without its conversation ``missing_field``. Files are read through fsspec, so a JSON
file on S3 reads its images from beside it there (an object store has no symlinks; the other
path checks are the same). A read that fails for another reason (a network error) raises a
StorageError naming the image and the JSON file.

The decoded value is ``{"conversations": [...], "images": (bytes, ...), "paths": (str, ...)}``
for the document kind (:mod:`datalane.engine.documents.llava`); the images are not part of the
plan's file identities (a changed image file changes the pixels, not the fingerprint).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from datalane.engine.files import SourceFile, open_file
from datalane.engine.formats.base import Chunk, Decoded, Ref, TooLarge
from datalane.engine.formats.jsonarray import array_chunks, array_start, elements
from datalane.engine.formats.jsonl import Jsonl, JsonlReader, parse_object
from datalane.spec.errors import StorageError
from datalane.spec.limits import IMAGE_TOO_LARGE
from datalane.spec.llava import LlavaSpec

__all__ = ["IMAGE_MISSING", "IMAGE_PATH", "RECORD_REASONS", "Folder", "LlavaJson", "Located"]

IMAGE_PATH = "image_path"
IMAGE_MISSING = "image_missing"
MALFORMED = "malformed_sample"
TOO_MANY_IMAGES = "too_many_images"
#: the bad-record reasons of :meth:`LlavaJson.decode` beyond the JSON format's
RECORD_REASONS = frozenset({IMAGE_PATH, IMAGE_MISSING, IMAGE_TOO_LARGE, MALFORMED,
                            TOO_MANY_IMAGES})

_SCHEME = re.compile(r"^[^/]*:")  # a first component holding ':' (s3:, file:, data:, C:)


@dataclass(frozen=True)
class Folder:
    """The folder of one JSON file, where its records' images are."""

    uri: str  # of the JSON file (errors name it)
    fs: Any
    path: str  # the folder, as its filesystem names it
    real: str | None  # a local folder with its symlinks resolved; None: not local

    @classmethod
    def of(cls, uri: str) -> Folder:
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
        cut = path.rfind("/")
        folder = path[:cut] if cut > 0 else "/" if cut == 0 else ""
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        real = os.path.realpath(folder or ".") if protocols & {"file", "local"} else None
        return cls(uri, fs, folder, real)

    def read(self, rel: Any, max_bytes: int) -> tuple[bytes | None, str, str]:
        """The bytes of the image at ``rel``, or ``(None, reason, detail)``."""
        parts, why = _relative(rel, local=self.real is not None)
        if parts is None:
            return None, IMAGE_PATH, why
        joined = "/".join([self.path, *parts]) if self.path else "/".join(parts)
        try:
            if self.real is not None:
                return _read_local(self.real, joined, max_bytes)
            return _read_remote(self.fs, joined, max_bytes)
        except OSError as e:
            # a path the record got wrong fails the same way every time: a bad record, never
            # a transient error (the job would retry the same record forever)
            bad = _BAD_PATH_ERRORS.get(e.errno or 0)
            if bad is not None:
                return None, *bad
            raise StorageError(f"cannot read the image {rel!r} of {self.uri}: {e}",
                               transient=True) from e


#: errno of a read -> (reason, detail): errors of the path itself, not of the storage
_BAD_PATH_ERRORS: dict[int, tuple[str, str]] = {
    errno.ENOENT: (IMAGE_MISSING, "no such file beside the JSON file"),
    errno.ENOTDIR: (IMAGE_MISSING, "no such file beside the JSON file (a component of the "
                                   "path is a file, not a folder)"),
    errno.ENAMETOOLONG: (IMAGE_PATH, "the path (or one of its components) is too long for "
                                     "the filesystem"),
    errno.ELOOP: (IMAGE_PATH, "the path goes round a loop of symlinks"),
}


def _relative(rel: Any, local: bool) -> tuple[list[str] | None, str]:
    """The components of a relative image path, or ``(None, why it is refused)``. Off a
    local filesystem the path becomes part of a URL (fsspec's http, S3 keys), where ``%``
    escapes are decoded (``%2e%2e/`` is ``../``) and ``?`` / ``#`` end the path: refused."""
    if not isinstance(rel, str) or not rel:
        what = "an empty string" if rel == "" else type(rel).__name__
        return None, f"the path is {what}, not a relative path"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return None, "the path is not valid Unicode (it holds a lone surrogate)"
    if "\x00" in rel or "\\" in rel:
        return None, "the path holds a NUL byte or a backslash"
    if rel.startswith("/"):
        return None, "the path is absolute; image paths are relative to the JSON file's folder"
    if _SCHEME.match(rel):
        return None, "the path is a URI (its first component holds ':'); image paths are " \
                     "relative to the JSON file's folder"
    if not local and any(c in rel for c in "%?#"):
        return None, ("the path holds '%', '?' or '#', which a URL would decode or cut; on a "
                      "remote filesystem image paths are plain names")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, "the path holds '..'; an image must lie in the JSON file's folder"
    if not parts:
        return None, "the path names the folder itself, not a file"
    return parts, ""


def _read_local(root: str, path: str, max_bytes: int) -> tuple[bytes | None, str, str]:
    real = os.path.realpath(path)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        return None, IMAGE_PATH, (f"the path leads outside the JSON file's folder {root!r} "
                                  f"once symlinks are resolved")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None, IMAGE_MISSING, "no such file beside the JSON file"
    import stat

    if not stat.S_ISREG(st.st_mode):
        return None, IMAGE_MISSING, "not a file (a directory or a device)"
    if st.st_size > max_bytes:
        return None, IMAGE_TOO_LARGE, (f"{st.st_size:,} bytes, over limits.max_bytes "
                                       f"{max_bytes:,}")
    with open(real, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since the stat
        return None, IMAGE_TOO_LARGE, f"over limits.max_bytes {max_bytes:,}"
    return data, "", ""


def _read_remote(fs: Any, path: str, max_bytes: int) -> tuple[bytes | None, str, str]:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None, IMAGE_MISSING, "no such object beside the JSON file"
    if info.get("type") == "directory":
        return None, IMAGE_MISSING, "not a file (a directory)"
    size = int(info.get("size") or 0)
    if size > max_bytes:
        return None, IMAGE_TOO_LARGE, f"{size:,} bytes, over limits.max_bytes {max_bytes:,}"
    try:
        data: bytes = fs.cat_file(path, start=0, end=max_bytes + 1)
    except FileNotFoundError:
        return None, IMAGE_MISSING, "no such object beside the JSON file"
    if len(data) > max_bytes:
        return None, IMAGE_TOO_LARGE, f"over limits.max_bytes {max_bytes:,}"
    return data, "", ""


@dataclass(frozen=True, slots=True)
class Located:
    """A record's bytes and the folder of the file it came from."""

    data: bytes
    folder: Folder


class LlavaReader:
    """Records of one llava source's JSON and JSONL files, each with its file's folder."""

    def __init__(self, files: list[SourceFile], field: str) -> None:
        self._files = files
        self._lines = JsonlReader(files, field)
        self._folders: dict[int, Folder] = {}
        self._begin: dict[int, int | None] = {}  # file -> just after its '[', None: JSONL

    def _folder(self, file: int) -> Folder:
        folder = self._folders.get(file)
        if folder is None:
            folder = self._folders[file] = Folder.of(self._files[file].uri)
        return folder

    def _array(self, file: int) -> int | None:
        if file not in self._begin:
            sf = self._files[file]
            if sf.compression is not None:
                self._begin[file] = None
            else:
                with open_file(sf, ranged=True) as f:
                    self._begin[file] = array_start(f, sf.uri)
        return self._begin[file]

    def _located(self, raw: Any, file: int) -> Any:
        return raw if isinstance(raw, TooLarge) else Located(raw, self._folder(file))

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        begin = self._array(chunk.file)
        if begin is None:
            for pos, raw in self._lines.records(chunk, start):
                yield pos, self._located(raw, chunk.file)
            return
        sf = self._files[chunk.file]
        at = chunk.start if start is None else start
        with open_file(sf, ranged=True) as f:
            f.seek(at)
            for pos, raw in elements(f, at, chunk.stop, sf.uri, at == begin):
                yield pos, self._located(raw, chunk.file)

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        begin = self._array(file)
        if begin is None:
            return self._located(self._lines.read_one(ref), file)
        sf = self._files[file]
        with open_file(sf, ranged=True) as f:
            f.seek(pos)
            for _, raw in elements(f, pos, -1, sf.uri, pos == begin):
                return self._located(raw, file)
        return TooLarge(0, "array element")  # unreachable: a reference names an element

    def fields(self, file: int) -> list[str]:
        if self._array(file) is None:
            return self._lines.fields(file)
        chunk = Chunk(file, self._begin[file] or 0, -1)
        for seen, (_, raw) in enumerate(self.records(chunk)):
            if seen >= 100:
                break
            if isinstance(raw, Located):
                obj, _, _ = parse_object(raw.data)
                if obj is not None:
                    return [str(k) for k in obj]
        return []

    def close(self) -> None:
        self._lines.close()


class LlavaJson(Jsonl):
    """The JSON format as a llava source reads it: arrays or JSONL, images read beside."""

    def __init__(self, spec: LlavaSpec) -> None:
        self.spec = spec
        self.bad_reasons = Jsonl.bad_reasons | RECORD_REASONS

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is None:
            with open_file(sf, ranged=True) as f:
                if array_start(f, sf.uri) is not None:
                    f.seek(0)
                    return array_chunks(index, f, sf.uri, chunk_bytes)
        return super().cut(index, sf, chunk_bytes, chunk_rows)

    def reader(self, files: list[SourceFile], field: str) -> LlavaReader:  # type: ignore[override]
        return LlavaReader(files, field)

    def decode(self, raw: Any, field: str) -> Decoded:
        spec = self.spec
        obj, reason, detail = parse_object(raw.data)
        if obj is None:
            return None, reason, detail
        conv = obj.get(spec.messages_field)
        if conv is None:
            return None, "missing_field", f"no field {spec.messages_field!r}"
        image = obj.get(spec.image_field)
        paths = [] if image is None else [image] if isinstance(image, str) else image
        if not isinstance(paths, list):
            return None, MALFORMED, (f"field {spec.image_field!r} holds "
                                     f"{type(image).__name__}, not a path or a list of paths")
        if len(paths) > spec.max_images:
            return None, TOO_MANY_IMAGES, (f"{len(paths)} images, more than max_images "
                                           f"{spec.max_images}")
        images = []
        for k, rel in enumerate(paths):
            data, reason, detail = raw.folder.read(rel, spec.limits.max_bytes)
            if data is None:
                at = spec.image_field if isinstance(image, str) else f"{spec.image_field}[{k}]"
                shown = repr(rel)[:200] if isinstance(rel, str) else type(rel).__name__
                return None, reason, f"{at} {shown}: {detail}"
            images.append(data)
        return {"conversations": conv, "images": tuple(images),
                "paths": tuple(str(p) for p in paths)}, None, None
