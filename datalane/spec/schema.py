"""The sample schema: the named, typed columns every sequence of a recipe carries.

A text recipe's samples are ``input_ids`` (int32, padded with the tokenizer's pad id) and
``positions`` (int32: the position of each token in its document, restarting at 0 at every
document and every sequence; -1 on padding). Document kinds that know more about their tokens
add columns; chat adds ``loss_mask`` (uint8: 1 where the trainer learns the token). The schema
is declared once, by the recipe (:func:`datalane.spec.recipe.Recipe.schema` names the column
set; the plan fills in the pad id), and everything downstream - packers, windows, the loader,
the wire and its shared-memory slots, the client, the torch adapter - carries the columns
generically, in schema order. The canonical hash covers them in that order, so a text
recipe's hashes are those of the two-column format.

A column is *per token* (shape ``(rows, seq_len + 1)``), per sequence (shape ``(rows,)``) or
*per image* (vision recipes: :mod:`datalane.spec.imagecolumns`): one row per image the rows
hold (``image``), one more (``bound``), or one per patch row of those images (``patch``),
``width`` values a row; its row count varies by microbatch, bounded by the rows' tokens
(:meth:`Column.capacity`: a placeholder run is at least 3 tokens, a placeholder stands for
``patches_per_token`` patch rows). Per-image columns come after the others, so a recipe without
them hashes and lays out as before. Its ``fill`` says where a packer takes a per-token column's
values: ``document`` columns are copied from the document's own tokens (a document of a kind
that lacks the column gets ``default``), ``position`` columns count tokens within each document
piece.

A schema with per-image columns also carries the recipe's :class:`~datalane.spec.visioncontract.
VisionContract` (``vision``: the vision tokens' ids and the patch rule a trainer needs to build
its model's batch). It is not part of :meth:`SampleSchema.dumps` (the columns, which old
clients parse strictly): the wire announces it in a message of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from datalane.spec.errors import MismatchError
from datalane.spec.visioncontract import VisionContract

__all__ = ["DTYPES", "IMAGE_HEADER", "Column", "SampleSchema", "SlotField", "TextColumns",
           "text_schema"]

#: Column types, by name, as little-endian numpy dtypes (the wire and the hash use these bytes).
DTYPES: dict[str, np.dtype[Any]] = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8"),
                                    "uint8": np.dtype("|u1")}
_ALIGN = 8  # every column of a shared-memory slot starts on an 8-byte boundary
#: a slot of a schema with per-image columns starts with the two counts of its images (int64
#: images, int64 patch rows), its columns after them; other schemas' slots have no header
IMAGE_HEADER = 16
_KEYS = {"name", "dtype", "pad", "fill", "default", "per_token"}  # a column's JSON
_IMAGE_KEYS = {"image", "width", "patches_per_token"}  # and a per-image column's


@dataclass(frozen=True)
class Column:
    """One column of a sample."""

    name: str
    dtype: str  # a key of DTYPES
    pad: int  # value on padding tokens (and on rows of a lane that ended)
    fill: Literal["document", "position"] = "document"
    default: int = 0  # value of a document column for documents that do not provide it
    per_token: bool = True
    #: a per-image column (``per_token`` False): what its rows count, images, images + 1
    #: (``bound``) or patch rows; None for a per-token or per-sequence column
    image: Literal["image", "bound", "patch"] | None = None
    width: int = 0  # values per row of a per-image column (0: a 1-D column)
    patches_per_token: int = 0  # ``patch`` rows: the most a placeholder token stands for

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return DTYPES[self.dtype]

    @property
    def per_image(self) -> bool:
        return self.image is not None

    def capacity(self, rows: int, seq_tokens: int) -> int:
        """The most rows a per-image column of ``rows`` sequences can have: each image's
        placeholder run is at least 3 tokens (start, one placeholder, end), and each
        placeholder stands for at most ``patches_per_token`` patch rows."""
        images = rows * (seq_tokens // 3)
        if self.image == "patch":
            return rows * (seq_tokens - 1) * self.patches_per_token
        return images + 1 if self.image == "bound" else images

    def shape(self, rows: int, seq_tokens: int) -> tuple[int, ...]:
        """The column's shape for ``rows`` sequences (a per-image column: at capacity)."""
        if self.image is not None:
            cap = self.capacity(rows, seq_tokens)
            return (cap, self.width) if self.width else (cap,)
        return (rows, seq_tokens) if self.per_token else (rows,)

    def nbytes(self, rows: int, seq_tokens: int) -> int:
        return int(np.prod(self.shape(rows, seq_tokens))) * self.np_dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "dtype": self.dtype, "pad": self.pad, "fill": self.fill,
               "default": self.default, "per_token": self.per_token}
        if self.image is not None:  # (other columns announce what they always did)
            out.update(image=self.image, width=self.width,
                       patches_per_token=self.patches_per_token)
        return out


@dataclass(frozen=True)
class SlotField:
    """Where one column of a microbatch lies in a shared-memory slot (or an inline buffer)."""

    column: Column
    offset: int  # bytes from the slot's start
    nbytes: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SampleSchema:
    """The columns of a recipe's samples, in canonical (hash and wire) order."""

    columns: tuple[Column, ...]
    #: a vision recipe's special-token ids and patch rule (None: no images, or a schema
    #: announced by a sidecar that predates the contract)
    vision: VisionContract | None = None

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"a sample schema names a column twice: {names}")
        for c in self.columns:
            if c.dtype not in DTYPES:
                raise ValueError(f"column {c.name!r} has the unknown dtype {c.dtype!r}")
            info = np.iinfo(DTYPES[c.dtype])  # every value array of the column holds them
            for what, value in (("pad", c.pad), ("default", c.default)):
                if not info.min <= value <= info.max:
                    raise ValueError(f"column {c.name!r} has the {what} {value}, which "
                                     f"{c.dtype} cannot hold ({info.min}..{info.max})")
            if c.image is not None and (c.per_token or c.image not in ("image", "bound", "patch")
                                        or c.width < 0 or c.patches_per_token < 0
                                        or (c.image == "patch") != (c.patches_per_token > 0)):
                raise ValueError(f"column {c.name!r} is not a per-image column: per_token "
                                 f"{c.per_token}, image {c.image!r}, width {c.width}, "
                                 f"patches_per_token {c.patches_per_token}")
        kinds = [c.per_image for c in self.columns]
        if kinds != sorted(kinds):
            raise ValueError(f"a sample schema's per-image columns come after the others: "
                             f"{names}")
        if self.vision is not None:
            self._check_vision(self.vision)

    def _check_vision(self, vision: VisionContract) -> None:
        """The contract fits the columns: patch rows of its patch size, a placeholder for
        ``merge_size**2`` of them, ``input_ids`` padded with its pad id."""
        patches = [c for c in self.columns if c.image == "patch"]
        if not patches:
            raise ValueError(f"a sample schema without per-image columns has a vision "
                             f"contract: {vision}")
        c = patches[0]
        if (c.width, c.patches_per_token) != (vision.patch_width, vision.merge_size ** 2):
            raise ValueError(f"column {c.name!r} has rows of {c.width} bytes, "
                             f"{c.patches_per_token} to a placeholder; the vision contract's "
                             f"patch_size {vision.patch_size} and merge_size "
                             f"{vision.merge_size} make {vision.patch_width} and "
                             f"{vision.merge_size ** 2}")
        ids = next((c for c in self.columns if c.name == "input_ids"), None)
        if ids is not None and ids.pad != vision.pad_id:
            raise ValueError(f"column 'input_ids' is padded with {ids.pad}; the vision "
                             f"contract's pad_id is {vision.pad_id}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def __iter__(self) -> Iterator[Column]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def document_columns(self) -> tuple[Column, ...]:
        """The columns a packer copies from documents (``input_ids`` first)."""
        return tuple(c for c in self.columns if c.fill == "document" and not c.per_image)

    @property
    def image_columns(self) -> tuple[Column, ...]:
        """The per-image columns (none for a recipe without images)."""
        return tuple(c for c in self.columns if c.per_image)

    def empty(self, rows: int, seq_tokens: int) -> dict[str, np.ndarray]:
        """Arrays of ``rows`` sequences, every value its column's pad (and no image)."""
        return {c.name: _no_images(c) if c.per_image else
                np.full(c.shape(rows, seq_tokens), c.pad, dtype=c.np_dtype)
                for c in self.columns}

    def layout(self, rows: int, seq_tokens: int) -> list[SlotField]:
        """Byte layout of ``rows`` sequences: the columns back to back, each 8-byte aligned
        (per-image columns at their capacity, after the :data:`IMAGE_HEADER` of their counts)."""
        out: list[SlotField] = []
        at = IMAGE_HEADER if self.image_columns else 0
        for c in self.columns:
            n = c.nbytes(rows, seq_tokens)
            out.append(SlotField(c, at, n, c.shape(rows, seq_tokens)))
            at += -(-n // _ALIGN) * _ALIGN
        return out

    def slot_bytes(self, rows: int, seq_tokens: int) -> int:
        """Bytes of ``rows`` sequences in the :meth:`layout`."""
        last = self.layout(rows, seq_tokens)[-1]
        return -(-(last.offset + last.nbytes) // _ALIGN) * _ALIGN

    def check(self, columns: Mapping[str, np.ndarray], rows: int, seq_tokens: int,
              where: str) -> None:
        """Refuse arrays that do not match the schema (names, dtypes, shapes)."""
        if tuple(columns) != self.names:
            raise MismatchError(f"{where} has the columns {list(columns)}; the schema has "
                                f"{list(self.names)}")
        for c in self.columns:
            a = columns[c.name]
            want = c.shape(rows, seq_tokens)
            if c.per_image:  # as many rows as used, up to the capacity
                low = 1 if c.image == "bound" else 0
                ok = a.shape[1:] == want[1:] and low <= a.shape[0] <= want[0] if a.ndim else False
                want_text = f"{c.dtype}[{low}..{want[0]}{''.join(f', {d}' for d in want[1:])}]"
            else:
                ok = a.shape == want
                want_text = f"{c.dtype}{list(want)}"
            if a.dtype != c.np_dtype or not ok:
                raise MismatchError(f"{where}: column {c.name!r} is {a.dtype}{list(a.shape)}; "
                                    f"the schema has {want_text}")

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.columns]

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any, where: str = "sample schema",
                  vision: VisionContract | None = None) -> SampleSchema:
        """Parse a schema announced by a sidecar (with the vision contract it announces
        beside it); MismatchError naming ``where`` if malformed or if they disagree."""
        if not isinstance(data, list) or not data:
            raise MismatchError(f"{where} must be a non-empty list of columns, got {data!r:.80}")
        cols = []
        for i, item in enumerate(data):
            if not isinstance(item, dict) or set(item) not in (_KEYS, _KEYS | _IMAGE_KEYS):
                raise MismatchError(f"{where}[{i}] is not a column: {item!r:.80}")
            if item["dtype"] not in DTYPES or item["fill"] not in ("document", "position"):
                raise MismatchError(f"{where}[{i}] has dtype {item['dtype']!r} and fill "
                                    f"{item['fill']!r}; known: {sorted(DTYPES)}, document, "
                                    f"position")
            ints = (item["pad"], item["default"])
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or \
                    not isinstance(item["per_token"], bool) or not isinstance(item["name"], str):
                raise MismatchError(f"{where}[{i}] has a malformed field: {item!r:.80}")
            image = {}
            if "image" in item:
                if item["image"] not in ("image", "bound", "patch") or not all(
                        isinstance(item[k], int) and not isinstance(item[k], bool)
                        for k in ("width", "patches_per_token")):
                    raise MismatchError(f"{where}[{i}] is not a per-image column: "
                                        f"{item!r:.120}")
                image = {k: item[k] for k in _IMAGE_KEYS}
            cols.append(Column(item["name"], item["dtype"], item["pad"], item["fill"],
                               item["default"], item["per_token"], **image))
        try:
            return cls(tuple(cols), vision)
        except ValueError as e:
            raise MismatchError(f"{where}: {e}") from e


class TextColumns:
    """``input_ids`` and ``positions`` as attributes of anything that holds ``columns`` (a
    window, a step, a microbatch, a client's batch): every schema has these two."""

    __slots__ = ()
    columns: dict[str, np.ndarray]

    @property
    def input_ids(self) -> np.ndarray:
        return self.columns["input_ids"]

    @property
    def positions(self) -> np.ndarray:
        """Position of each token in its document piece; -1 marks padding."""
        return self.columns["positions"]


def text_schema(pad_id: int, extra: Sequence[Column] = (),
                vision: VisionContract | None = None) -> SampleSchema:
    """``input_ids`` and ``positions``, then the ``extra`` columns of the recipe's kinds (their
    per-image columns last), with the recipe's ``vision`` contract if it has images."""
    return SampleSchema((Column("input_ids", "int32", pad_id),
                         Column("positions", "int32", -1, fill="position"),
                         *(c for c in extra if not c.per_image),
                         *(c for c in extra if c.per_image)), vision)


def _no_images(c: Column) -> np.ndarray:
    """A per-image column holding no image (``bound``: the one start, 0)."""
    rows = 1 if c.image == "bound" else 0
    return np.zeros((rows, c.width) if c.width else (rows,), dtype=c.np_dtype)
