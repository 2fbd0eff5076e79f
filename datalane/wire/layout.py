"""Where each column of a microbatch lies on the wire: the layout a sidecar announces.

A microbatch of ``rows`` sequences is the columns of the recipe's sample schema
(:mod:`datalane.spec.schema`), in schema order. The sidecar builds the layout from the schema
(:meth:`Layout.of`: ``SampleSchema.layout``, columns back to back, each 8-byte aligned) and
announces it in the reply to Open (:meth:`Layout.announce`: ``schema_json``, one
``ColumnSlot`` per column and ``slot_bytes``; its Health carries the schema too:
:func:`announce_schema`), with a vision recipe's contract (``vision``: the vision tokens' ids
and the patch rule, :mod:`datalane.spec.visioncontract`; unset for a text recipe, whose replies
are the bytes they always were). The client
derives nothing: it reads the announcement (:meth:`Layout.announced`; a Health's schema:
:func:`announced_schema`), checks schema and layout against each other (names in order,
dtypes, sizes, bounds, no overlap) and against what it reads of them
(:meth:`Layout.check_client`: the rows it asked for, the text columns), and makes its arrays
from the announced offsets and shapes. So a new column (a chat recipe's ``loss_mask``) or
another alignment on the sidecar needs no change in the client, and a malformed announcement
is a :class:`~datalane.spec.errors.MismatchError` naming what is wrong, never misread bytes.
These checks are the client's (:mod:`datalane.client.sidecar` calls them); they live here,
beside the layout they check.

Payloads: inline, one buffer per column (:meth:`Layout.pack` / :meth:`Layout.unpack`); in
shared memory, the columns at their offsets in a slot of ``slot_bytes``
(:meth:`Layout.write` / :meth:`Layout.views`, used by :mod:`datalane.wire.shm`).

**Per-image columns** (vision recipes: :mod:`datalane.spec.imagecolumns`) have as many rows
as the microbatch has images (or patch rows). The layout reserves each its capacity for the
microbatch's sequences (:meth:`~datalane.spec.schema.Column.capacity`), so a session's slot
size stays fixed, and a slot starts with a header of the two counts (int64 images, int64
patch rows: :data:`~datalane.spec.schema.IMAGE_HEADER` bytes); only the used rows are written
and read. Inline buffers carry the used rows only, their lengths giving the counts. Either way
the client checks the counts against the capacity and the columns against each other
(:func:`datalane.spec.imagecolumns.check`) before it hands them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.integrity import parse_json
from datalane.spec.schema import DTYPES, IMAGE_HEADER, SampleSchema, SlotField
from datalane.spec.visioncontract import VisionContract

__all__ = ["Layout", "announce_schema", "announced_schema", "announced_vision"]


def announce_schema(reply: Any, schema: SampleSchema) -> None:
    """Write the schema (``schema_json``) and its vision contract (``vision``, only for a
    schema that has one) into a reply to Open or Health."""
    reply.schema_json = schema.dumps()
    if schema.vision is not None:  # (the message's fields are the contract's, by name)
        reply.vision.CopyFrom(type(reply.vision)(**schema.vision.to_dict()))


def announced_vision(reply: Any, where: str) -> VisionContract | None:
    """The vision contract a reply announces (None if it has none), checked; MismatchError
    naming ``where`` and the bad field."""
    if not reply.HasField("vision"):
        return None
    v = reply.vision
    try:
        return VisionContract(
            int(v.image_id), int(v.video_id), int(v.vision_start_id), int(v.vision_end_id),
            int(v.pad_id), int(v.patch_size), int(v.temporal_patch_size), int(v.merge_size),
            v.order, tuple(v.image_mean), tuple(v.image_std))
    except ValueError as e:
        raise MismatchError(f"{where}: vision: {e}") from None


def announced_schema(reply: Any, where: str) -> SampleSchema:
    """The sample schema a reply (Open's or Health's) announces in ``schema_json``, with its
    vision contract, checked; MismatchError naming ``where``."""
    if not reply.schema_json:
        raise MismatchError(f"{where} announces no sample schema: the sidecar predates "
                            f"wire protocol 2 (typed columns); upgrade the sidecar")
    return SampleSchema.from_json(
        parse_json(reply.schema_json, f"{where}: schema_json", MismatchError),
        f"{where}: schema_json", announced_vision(reply, where))


@dataclass(frozen=True)
class Layout:
    """The sample schema and the byte layout of one microbatch of ``rows`` sequences."""

    schema: SampleSchema
    fields: tuple[SlotField, ...]  # one per column, in schema order
    slot_bytes: int

    @classmethod
    def of(cls, schema: SampleSchema, rows: int, seq_tokens: int) -> Layout:
        """The sidecar's layout of microbatches of ``rows`` sequences."""
        return cls(schema, tuple(schema.layout(rows, seq_tokens)),
                   schema.slot_bytes(rows, seq_tokens))

    @property
    def rows(self) -> int:
        """Sequences per microbatch."""
        return self.fields[0].shape[0]

    @property
    def seq_tokens(self) -> int:
        """Tokens per sequence (``input_ids`` is per token)."""
        return self.fields[0].shape[1]

    # -- the announcement --------------------------------------------------------------------
    def announce(self, reply: Any) -> None:
        """Write the schema (with its vision contract) and the layout into an ``OpenReply``."""
        announce_schema(reply, self.schema)
        reply.slot_bytes = self.slot_bytes
        for f in self.fields:
            reply.layout.add(name=f.column.name, dtype=f.column.dtype, offset=f.offset,
                             nbytes=f.nbytes, shape=list(f.shape))

    @classmethod
    def announced(cls, reply: Any, where: str) -> Layout:
        """The layout an ``OpenReply`` announces, checked; MismatchError naming ``where``."""
        schema = announced_schema(reply, where)
        slot_bytes = int(reply.slot_bytes)
        names = [f.name for f in reply.layout]
        if names != list(schema.names):
            raise MismatchError(f"{where} lays out the columns {names}; its schema has "
                                f"{list(schema.names)}")
        fields: list[SlotField] = []
        for f, column in zip(reply.layout, schema, strict=True):
            shape = tuple(int(n) for n in f.shape)
            what = f"{where}: column {column.name!r}"
            if f.dtype != column.dtype:
                raise MismatchError(f"{what} is laid out as {f.dtype!r}; the schema says "
                                    f"{column.dtype!r}")
            two = bool(column.width) if column.per_image else column.per_token
            if len(shape) != (2 if two else 1):
                kind = ("per-image" if column.per_image else
                        "per-token" if column.per_token else "per-sequence")
                raise MismatchError(f"{what} has the shape {list(shape)}; this {kind} column "
                                    f"has {2 if two else 1} dimensions")
            itemsize = DTYPES[column.dtype].itemsize
            if int(f.nbytes) != int(np.prod(shape)) * itemsize:
                raise MismatchError(f"{what} has {f.nbytes} bytes; {column.dtype}"
                                    f"{list(shape)} is {int(np.prod(shape)) * itemsize}")
            if f.offset % itemsize:
                raise MismatchError(f"{what} starts at byte {f.offset}, not a multiple of its "
                                    f"item size {itemsize}")
            fields.append(SlotField(column, int(f.offset), int(f.nbytes), shape))
        plain = [f for f in fields if not f.column.per_image]
        rows = {f.shape[0] for f in plain}
        tokens = {f.shape[1] for f in plain if len(f.shape) == 2}
        if len(rows) > 1 or len(tokens) > 1:
            raise MismatchError(f"{where} lays out columns of different shapes: "
                                f"{[list(f.shape) for f in plain]}")
        if 0 in fields[0].shape:
            raise MismatchError(f"{where} lays out empty columns: {list(fields[0].shape)}")
        for f in fields:  # per-image columns: their capacity for the microbatch's sequences
            want = f.column.shape(fields[0].shape[0], fields[0].shape[1])
            if f.column.per_image and f.shape != want:
                raise MismatchError(f"{where}: per-image column {f.column.name!r} is laid out "
                                    f"as {list(f.shape)}; {list(fields[0].shape)} tokens hold "
                                    f"at most {list(want)}")
        end = IMAGE_HEADER if schema.image_columns else 0  # (the image counts' header)
        for f in sorted(fields, key=lambda f: f.offset):
            if f.offset < end:
                raise MismatchError(f"{where}: column {f.column.name!r} at byte {f.offset} "
                                    f"overlaps the column before it (which ends at {end})")
            end = f.offset + f.nbytes
        if end > slot_bytes:
            raise MismatchError(f"{where} lays out {end} bytes in a slot of {slot_bytes}")
        return cls(schema, tuple(fields), slot_bytes)

    def check_client(self, rows: int, where: str) -> None:
        """Check an announced layout against what a client reads of it: microbatches of the
        ``rows`` sequences it asked for, and the int32 per-token text columns every recipe
        has; MismatchError naming ``where``."""
        if self.rows != rows:
            raise MismatchError(f"{where} lays out microbatches of {self.rows} sequences; "
                                f"this loader asked for {rows}")
        for name in ("input_ids", "positions"):
            if name not in self.schema.names or \
                    self.schema.column(name).dtype != "int32" or \
                    not self.schema.column(name).per_token:
                raise MismatchError(f"{where} announces a schema without the int32 per-token "
                                    f"column {name!r} every recipe has: "
                                    f"{self.schema.dumps()[:200]}")

    # -- payloads ----------------------------------------------------------------------------
    def _arrays(self, columns: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if tuple(columns) != self.schema.names:
            raise ValueError(f"microbatch columns {list(columns)} are not the schema's "
                             f"{list(self.schema.names)}")
        out = []
        for f in self.fields:
            a = np.ascontiguousarray(columns[f.column.name], dtype=f.column.np_dtype)
            if a.shape != f.shape and not (f.column.per_image and a.shape[1:] == f.shape[1:]
                                           and len(a) <= f.shape[0]):
                raise ValueError(f"column {f.column.name!r} has the shape {list(a.shape)}; "
                                 f"the layout has {list(f.shape)}")
            out.append(a)
        return out

    def _used(self, f: SlotField, count: dict[str | None, int]) -> tuple[int, ...]:
        """The shape of a column's used rows (``count``: rows by kind of per-image column)."""
        return (count[f.column.image], *f.shape[1:]) if f.column.per_image else f.shape

    def _checked(self, out: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        if self.schema.image_columns:
            imagecolumns.check(out, self.rows, self.seq_tokens, where)
        return out

    def pack(self, columns: Mapping[str, np.ndarray]) -> list[bytes]:
        """Inline buffers of a microbatch's columns, in schema order."""
        return [a.tobytes() for a in self._arrays(columns)]

    def unpack(self, payloads: Sequence[bytes], where: str) -> dict[str, np.ndarray]:
        """Read-only arrays over inline buffers; MismatchError if one has the wrong size."""
        if len(payloads) != len(self.fields):
            raise MismatchError(f"{where} carries {len(payloads)} column buffers; the layout "
                                f"has {len(self.fields)} ({list(self.schema.names)})")
        out: dict[str, np.ndarray] = {}
        for f, data in zip(self.fields, payloads, strict=True):
            shape = f.shape
            if f.column.per_image:  # the used rows only
                row = f.column.np_dtype.itemsize * (f.column.width or 1)
                shape = (len(data) // row, *f.shape[1:])
                if len(data) % row or shape[0] > f.shape[0]:
                    raise MismatchError(f"{where}: per-image column {f.column.name!r} has "
                                        f"{len(data)} bytes; the layout holds up to "
                                        f"{f.shape[0]} rows of {row}")
            elif len(data) != f.nbytes:
                raise MismatchError(f"{where}: column {f.column.name!r} has {len(data)} bytes; "
                                    f"the layout announced {f.nbytes}")
            out[f.column.name] = np.frombuffer(data, dtype=f.column.np_dtype).reshape(shape)
        return self._checked(out, where)

    def write(self, buffer: Any, at: int, columns: Mapping[str, np.ndarray]) -> None:
        """Copy a microbatch's columns into ``buffer`` (a writable mmap) at byte ``at`` (with
        per-image columns: the header of their counts, then their used rows)."""
        arrays = self._arrays(columns)
        if self.schema.image_columns:
            count = {f.column.image: len(a) for f, a in zip(self.fields, arrays, strict=True)}
            buffer[at:at + IMAGE_HEADER] = np.array([count["image"], count["patch"]],
                                                    dtype="<i8").tobytes()
        for f, a in zip(self.fields, arrays, strict=True):
            if a.nbytes:
                start = at + f.offset
                buffer[start:start + a.nbytes] = a.reshape(-1).view(np.uint8).data

    def views(self, buffer: Any, at: int, where: str = "a shared-memory slot"
              ) -> dict[str, np.ndarray]:
        """Zero-copy arrays of the columns of the slot at byte ``at`` of ``buffer``;
        MismatchError naming ``where`` for image counts over the capacity or columns that
        do not agree."""
        count: dict[str | None, int] = {}
        if self.schema.image_columns:
            images, patches = (int(v) for v in np.frombuffer(buffer, dtype="<i8", count=2,
                                                             offset=at))
            count = {"image": images, "bound": images + 1, "patch": patches}
            caps = {f.column.image: f.shape[0] for f in self.fields if f.column.per_image}
            if not (0 <= images <= caps["image"] and 0 <= patches <= caps["patch"]):
                raise MismatchError(f"{where} at byte {at} counts {images} images and "
                                    f"{patches} patch rows; it holds at most {caps['image']} "
                                    f"and {caps['patch']}")
        out = {}
        for f in self.fields:
            shape = self._used(f, count)
            out[f.column.name] = np.frombuffer(buffer, dtype=f.column.np_dtype,
                                               count=int(np.prod(shape)),
                                               offset=at + f.offset).reshape(shape)
        return self._checked(out, where)
