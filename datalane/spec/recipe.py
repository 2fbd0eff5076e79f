"""The recipe: everything that decides *what* the model eats (docs/recipe.md).

A :class:`Recipe` is a frozen, strictly validated value. Load it with :func:`load_recipe`
(YAML or JSON file, or a mapping). Its JSON Schema (:func:`recipe_schema`) is the single source
of the ``spec.recipe`` schema in the ``DataPipeline`` CRD. Performance knobs (workers,
prefetch, world size) are deliberately *not* here: they live in :mod:`datalane.spec.knobs`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from datalane.spec import model
from datalane.spec.chat import ChatSpec
from datalane.spec.errors import ConfigError
from datalane.spec.formats import (
    FORMAT_NAMES,
    PART_FORMATS,
    TOKEN_FORMATS,
    format_reference,
    infer_format,
)
from datalane.spec.integrity import MAX_DEPTH, check_depth, parse_json, parse_text, read_bytes
from datalane.spec.lanes import nearest_multiples
from datalane.spec.llava import LlavaSpec
from datalane.spec.model import doc
from datalane.spec.packing import PACKER_NAMES, WHOLE_PACKERS, PackerName, packing_reference
from datalane.spec.phases import Phase, check_phases
from datalane.spec.tokens import TokensSpec
from datalane.spec.vision import InterleavedSpec, VisionSpec

__all__ = [
    "Filters",
    "Packing",
    "Recipe",
    "Shuffle",
    "Source",
    "TokenizerSpec",
    "document_kinds",
    "load_recipe",
    "part_formats",
    "recipe_schema",
]

RECIPE_VERSION = 1
MAX_SEQ_LEN = 1 << 20
"""Upper bound of ``seq_len`` (1,048,576 tokens)."""
MAX_GLOBAL_BATCH = 1 << 20
"""Upper bound of ``global_batch_size`` (1,048,576 sequences), hence of ``lanes`` too."""
MAX_STEP_TOKENS = 1 << 30
"""Upper bound of ``global_batch_size x (seq_len + 1)``, the tokens of one step (2^30: 8 GiB
of ``input_ids`` and ``positions`` for a process that serves every lane)."""
_NAME = r"[a-z0-9]([a-z0-9_-]{0,62})?"


@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer and the special tokens each document is wrapped in."""

    uri: str = doc("Path or fsspec URI of a Hugging Face `tokenizer.json`.")
    sha256: str | None = doc(
        "Expected SHA-256 of the tokenizer file; loading fails if the content differs.",
        default=None, pattern=r"[0-9a-f]{64}")
    add_bos: bool = doc("Prepend the BOS token to every document.", default=False)
    add_eos: bool = doc("Append the EOS token to every document.", default=True)
    bos_token: str = doc("Name of the BOS token in the vocabulary.", default="<|bos|>")
    eos_token: str = doc("Name of the EOS token in the vocabulary.", default="<|eos|>")
    pad_token: str | None = doc(
        "Name of the token used for padding; null means the EOS token. Padding is also "
        "marked by position -1, so trainers never need the id.", default=None)


@dataclass(frozen=True)
class Filters:
    """Document filters, applied before packing. Filtered documents are counted, never lost."""

    min_chars: int = doc("Drop documents shorter than this many characters.", default=0, ge=0)
    max_chars: int | None = doc("Drop documents longer than this many characters.",
                                default=None, ge=1)
    min_tokens: int = doc("Drop documents with fewer tokens (before BOS/EOS).", default=0, ge=0)
    max_tokens: int | None = doc("Drop documents with more tokens (before BOS/EOS).",
                                 default=None, ge=1)
    predicate: str | None = doc(
        "Import path `package.module:function` of a function `(text: str) -> bool`; "
        "documents for which it returns false are dropped.",
        default=None, pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

    def validate(self, where: str) -> None:
        for lo, hi in (("min_chars", "max_chars"), ("min_tokens", "max_tokens")):
            top = getattr(self, hi)
            if top is not None and getattr(self, lo) > top:
                raise ConfigError(
                    f"{_at(where, lo)} {getattr(self, lo)} is greater than {_at(where, hi)} "
                    f"{top}; no document could pass")


@dataclass(frozen=True)
class Source:
    """One data source: a set of files read as documents."""

    name: str = doc("Unique name of the source (lowercase letters, digits, '-', '_').",
                    pattern=_NAME)
    uris: list[str] = doc(
        "Paths, globs or fsspec URIs of the source files (`s3://bucket/web/*.parquet`). "
        "Matches are sorted; a pattern matching nothing is an error.", min_items=1)
    format: str | None = doc(format_reference(), default=None, choices=FORMAT_NAMES)
    text_field: str = doc(
        "Column (Parquet, MDS, Lance, HF) or key (JSONL) holding the document text; for "
        "WebDataset the extension of the member holding it (`txt`).", default="text")
    weight: float = doc(
        "Share of *tokens* this source contributes to each lane's mix from step 0 (0: none "
        "until a phase gives it a weight).", default=1.0, ge=0)
    epochs: int | None = doc("Passes over the source; null repeats it forever.",
                             default=1, ge=1)
    chunk_bytes: int = doc(
        "JSONL chunk size in bytes (chunks align to newlines); also the size of MDS, "
        "WebDataset and HF chunks when `chunk_rows` is null (aligned to samples, record "
        "batches). Compressed JSONL files are cut at zstd frame and gzip member boundaries, "
        "about `chunk_bytes` of compressed data a chunk (a file of one frame is one chunk); "
        "other compressed files are one chunk each.", default=1 << 20, ge=1)
    chunk_rows: int | None = doc(
        "Parquet chunk size in rows; null makes each row group one chunk. Also rows (HF, "
        "Lance: null makes a fragment one chunk) or samples (MDS, WebDataset) per chunk.",
        default=None, ge=1)
    filters: Filters | None = doc(
        "Filters for this source, replacing the recipe-level `filters`.", default=None)
    chat: ChatSpec | None = doc(
        "Read the source as chat conversations (rendered with a chat template, with a loss "
        "mask) instead of plain text; null: plain text in `text_field`.",
        default=None, omit_default=True)
    tokens: TokensSpec | None = doc(
        "Read the source as pre-tokenized documents (token ids, checked against the "
        "tokenizer's vocabulary, never tokenized again) instead of text; required for the "
        "`megatron` and `flatbin` formats; null: plain text in `text_field`.",
        default=None, omit_default=True)
    vision: VisionSpec | None = doc(
        "Read the source as image-caption pairs (WebDataset: an image member and a caption "
        "member per sample; Parquet, HF: an image column and a caption column): each "
        "document is the image's placeholder tokens, then its caption; the image's patches "
        "travel with it (docs/vlm.md). Needs `packing.algorithm: bestfit`; null: plain text "
        "in `text_field`.", default=None, omit_default=True)
    interleaved: InterleavedSpec | None = doc(
        "Read the source as interleaved image-text documents (OBELICS: a row's `texts` and "
        "`images` lists, Parquet or HF): each image's placeholder tokens in its place among "
        "the texts; the images' patches travel with it (docs/vlm.md). Needs "
        "`packing.algorithm: bestfit`; null: plain text in `text_field`.", default=None,
        omit_default=True)
    llava: LlavaSpec | None = doc(
        "Read the source as LLaVA records (a JSON file holding a list of them, or JSONL): "
        "each record's `conversations` rendered with the chat template, each `<image>` "
        "marker replaced by the placeholder tokens of the next image its `image` names, a "
        "path relative to the JSON file's folder; the images' patches travel with it "
        "(docs/vlm.md). Needs `packing.algorithm: bestfit`; null: plain text in "
        "`text_field`.", default=None, omit_default=True)

    @property
    def kind_config(self) -> Any:
        """The configuration of the source's document kind (``chat``, ``tokens``, ...), or
        None for plain text. A kind's configuration is the one field of this class whose
        value offers ``document_field``."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "document_field"):
                return value
        return None

    @property
    def field(self) -> str:
        """The field the records' documents are in."""
        config = self.kind_config
        return str(config.document_field) if config is not None else self.text_field

    @property
    def kind_field(self) -> str:
        """The name of the field holding the kind's configuration (``chat``, ...), or
        ``text``."""
        config = self.kind_config
        return next((f.name for f in dataclasses.fields(self)
                     if config is not None and getattr(self, f.name) is config), "text")

    def validate(self, where: str) -> None:
        named = {self.format} if self.format is not None else {
            infer_format(u) for u in self.uris}
        if hasattr(self.kind_config, "document_parts"):
            can = part_formats(self.kind_config)
            other = sorted(f for f in named if f is not None and f not in can)
            if other:
                kind = self.kind_field
                raise ConfigError(
                    f"{_at(where, kind)}: {'an' if kind[0] in 'aeiou' else 'a'} {kind} document "
                    f"is read from several fields of a record at once, which the {other[0]} "
                    f"format does not do; use {' or '.join(sorted(can))} files")
        if self.tokens is None:
            ids_only = sorted(f for f in named if f in TOKEN_FORMATS)
            if ids_only:
                raise ConfigError(
                    f"{where or 'source'}: {ids_only[0]} files hold token ids, not text; set "
                    f"{_at(where, 'tokens')} (for example `tokens: {{}}`) to read them")


def part_formats(config: Any) -> frozenset[str]:
    """The formats that can read the parts of a kind's configuration ``config``: those it
    names (``formats``: a kind whose format reads its parts its own way, llava's JSON), else
    every format declaring ``parts``."""
    named = getattr(config, "formats", None)
    return PART_FORMATS if named is None else frozenset(named)


def document_kinds() -> tuple[str, ...]:
    """The document kinds a source may be read as besides plain text, in declaration order:
    the fields of :class:`Source` whose configuration class names a ``document_field`` (the
    one declaration of a kind; the engine implements kind ``name`` in
    ``datalane.engine.documents.<name>``)."""
    hints = typing.get_type_hints(Source)
    return tuple(f.name for f in dataclasses.fields(Source)
                 if any(hasattr(t, "document_field") for t in typing.get_args(hints[f.name])))


@dataclass(frozen=True)
class Packing:
    """How documents become fixed-length sequences of `seq_len + 1` tokens."""

    algorithm: PackerName = doc(packing_reference(), default=PACKER_NAMES[0])
    bestfit_bins: int = doc("Open sequences `bestfit` chooses among.", default=8, ge=1, le=64)


@dataclass(frozen=True)
class Shuffle:
    """Document shuffle before packing: each block of documents is permuted."""

    block_size: int = doc(
        "Documents per shuffle block, per source and lane; 1 disables shuffling.",
        default=1024, ge=1)


# -- eval streams (issue 12 part 4; functions over them: datalane.spec.evals) ----------------

EVAL_NAME_PATTERN = r"[a-z0-9]([a-z0-9_-]{0,62})?"
"""Stream names: the pattern of source names (:mod:`datalane.spec.recipe`)."""

TRAIN = "train"
"""The name of the training stream (what an Open request's empty ``stream`` means)."""

INHERITED = ("lanes", "seq_len", "tokenizer", "filters", "packing", "shuffle", "bad_records",
             "bad_records_max_fraction", "version")
"""The recipe fields an eval stream takes from its recipe. ``sources``, ``global_batch_size``
and ``seed`` come from the stream; every other field (``eval``, and any field about the
training run's course) keeps its default in :func:`eval_recipe`."""


@dataclass(frozen=True)
class EvalStream:
    """A named eval stream: its own sources, read as the recipe's, for a fixed count of steps."""

    name: str = doc(
        "Unique name of the stream (lowercase letters, digits, '-', '_'); a client opens it "
        "with `stream=` this name. `train` names the training stream and is refused.",
        pattern=EVAL_NAME_PATTERN)
    sources: list[Source] = doc(
        "The stream's sources, mixed by their weights as the recipe's sources are, read with "
        "the recipe's tokenizer, filters, packing and shuffle. A training source may be an "
        "eval source too (the data is then not held out).", min_items=1)
    steps: int = doc(
        "Steps (global batches) of every evaluation: exactly this many, padded with "
        "`ended` set once the stream's data runs out.", ge=1)
    global_batch_size: int | None = doc(
        "Sequences per eval step; null means the recipe's. A multiple of `lanes`.",
        default=None, ge=1)
    seed: int | None = doc("Seed of the stream's permutations; null means the recipe's.",
                           default=None, ge=0)

    def validate(self, where: str) -> None:
        if self.name == TRAIN:
            raise ConfigError(f"{_at(where, 'name')} {TRAIN!r} names the training stream; give "
                              f"the eval stream another name")


@dataclass(frozen=True)
class Recipe:
    """A datalane recipe: sources, tokenizer, filters, mixture, packing, shuffle and lanes."""

    lanes: int = doc("Number of logical lanes L, fixed for the life of a run.", ge=1)
    global_batch_size: int = doc("Sequences per step B; a multiple of `lanes`.", ge=1)
    seq_len: int = doc("Sequence length; each sequence carries seq_len + 1 tokens.", ge=1)
    tokenizer: TokenizerSpec = doc("The tokenizer.")
    sources: list[Source] = doc("The sources to mix.", min_items=1)
    seed: int = doc("Seed of every permutation.", default=0, ge=0)
    filters: Filters = doc("Filters for every source without its own.", factory=Filters)
    packing: Packing = doc("Packing algorithm.", factory=Packing)
    shuffle: Shuffle = doc("Document shuffle.", factory=Shuffle)
    bad_records: Literal["skip", "fail"] = doc(
        "What to do with a malformed record: `skip` (counted per reason) or `fail`.",
        default="skip")
    bad_records_max_fraction: float | None = doc(
        "With `skip`: stop with an error once more than this fraction of a lane's records "
        "are malformed (checked from the lane's 1,000th record on); null never stops.",
        default=None, gt=0, le=1, omit_default=True)
    eval: list[EvalStream] = doc(
        "Eval streams: named held-out streams the sidecar serves next to the training "
        "stream (`SidecarLoader(stream=name)`), each read like the recipe's sources; not "
        "part of the training stream's fingerprint.", factory=list, omit_default=True)
    phases: list[Phase] = doc(
        "Mixture schedule: phases that change the source weights from a step on (a jump or "
        "a linear ramp); phase 0 is the sources' own weights from step 0.",
        factory=list, omit_default=True)
    version: int = doc("Recipe schema version.", default=RECIPE_VERSION, ge=1,
                       le=RECIPE_VERSION)

    @property
    def lane_batch(self) -> int:
        """Sequences each lane contributes per step (B / L)."""
        return self.global_batch_size // self.lanes

    @property
    def sequence_tokens(self) -> int:
        """Tokens per sequence (seq_len + 1)."""
        return self.seq_len + 1

    def filters_for(self, source: Source) -> Filters:
        return source.filters if source.filters is not None else self.filters

    def validate(self, where: str, inherited: Mapping[str, str] | None = None) -> None:
        """``inherited``: where each field this recipe took from another one is written (an
        eval stream's recipe: :func:`stream_recipe`), the path its errors name."""

        def at(name: str) -> str:
            field = name.split(".", maxsplit=1)[0]
            if inherited is not None and field in inherited:
                return _at(inherited[field], name)
            return _at(where, name)

        for name, value, top, unit in (
                ("seq_len", self.seq_len, MAX_SEQ_LEN, "tokens"),
                ("global_batch_size", self.global_batch_size, MAX_GLOBAL_BATCH, "sequences")):
            if value > top:
                raise ConfigError(f"{at(name)} {value} is above the limit of {top:,} {unit}")
        tokens = self.global_batch_size * self.sequence_tokens
        if tokens > MAX_STEP_TOKENS:
            raise ConfigError(
                f"{at('global_batch_size')} {self.global_batch_size} x "
                f"({at('seq_len')} {self.seq_len} + 1) = {tokens:,} tokens per step is "
                f"above the limit of {MAX_STEP_TOKENS:,}; use a smaller batch or sequence length")
        if self.global_batch_size % self.lanes:
            options = " or ".join(str(m) for m in
                                  nearest_multiples(self.global_batch_size, self.lanes))
            raise ConfigError(
                f"{at('global_batch_size')} {self.global_batch_size} is not a multiple "
                f"of lanes {self.lanes}; try {options}")
        seen: set[str] = set()
        for i, src in enumerate(self.sources):
            if src.name in seen:
                raise ConfigError(f"{_at(where, f'sources[{i}].name')} {src.name!r} is used by "
                                  f"another source; names must be unique")
            seen.add(src.name)
        for i, src in enumerate(self.sources):
            if getattr(src.kind_config, "whole_documents", False) and \
                    self.packing.algorithm not in WHOLE_PACKERS:
                raise ConfigError(
                    f"{_at(where, f'sources[{i}].{src.kind_field}')}: its documents must never "
                    f"be split across sequences, but {at('packing.algorithm')} "
                    f"{self.packing.algorithm!r} cuts documents anywhere; use "
                    f"{' or '.join(repr(p) for p in WHOLE_PACKERS)}")
        check_phases(self, where)
        validate_streams(self, where)

    def to_dict(self) -> dict[str, Any]:
        """Canonical plain form (every field, defaults included)."""
        out: dict[str, Any] = model.dump(self)
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def stream_recipe(recipe: Recipe, stream: EvalStream) -> Recipe:
    """Eval stream ``stream`` of ``recipe`` as a plain recipe
    (:func:`datalane.spec.evals.eval_recipe`)."""
    fields: dict[str, Any] = {f: getattr(recipe, f) for f in INHERITED}
    fields["sources"] = list(stream.sources)
    fields["global_batch_size"] = (stream.global_batch_size
                                   if stream.global_batch_size is not None
                                   else recipe.global_batch_size)
    fields["seed"] = stream.seed if stream.seed is not None else recipe.seed
    return Recipe(**fields)


def validate_streams(recipe: Recipe, where: str) -> None:
    """Check the recipe's eval streams: unique names, and each stream's recipe valid (its
    batch a multiple of lanes, within the limits; its source names unique; ...), errors
    naming the field as ``eval[i].<field>``."""
    seen: set[str] = set()
    for i, stream in enumerate(recipe.eval):
        at = _at(where, f"eval[{i}]")
        if stream.name in seen:
            raise ConfigError(f"{at}.name {stream.name!r} is used by another eval stream; "
                              f"names must be unique")
        seen.add(stream.name)
        # the fields the stream takes from the recipe are named where the recipe writes them
        inherited = {f: where for f in INHERITED}
        if stream.global_batch_size is None:
            inherited["global_batch_size"] = where
        stream_recipe(recipe, stream).validate(at, inherited)


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def recipe_schema() -> dict[str, Any]:
    """JSON Schema of a recipe; the CRD's `spec.recipe` is generated from it."""
    return model.json_schema(Recipe)


def load_recipe(source: str | os.PathLike[str] | Mapping[str, Any]) -> Recipe:
    """Load a recipe from a YAML/JSON file path or a mapping; errors name the bad field."""
    if isinstance(source, Mapping):
        return model.load(Recipe, source)
    path = os.fspath(source)
    raw = read_bytes(path, "recipe")
    data: Any
    if path.endswith(".json"):
        data = parse_json(raw, f"recipe {path}", object_pairs_hook=_no_duplicates(path))
    else:
        text = parse_text(raw, f"recipe {path}")
        data = _load_yaml(text, path)
        check_depth(data, f"recipe {path}")
    if data is None:
        raise ConfigError(f"recipe {path} is empty")
    recipe = model.load(Recipe, data)
    return _resolve_relative(recipe, os.path.dirname(os.path.abspath(path)))


def _no_duplicates(path: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"recipe {path}: the key {key!r} appears twice in one mapping")
            out[key] = value
        return out

    return hook


def _load_yaml(text: str, path: str) -> Any:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """Safe YAML that refuses a key given twice (the later one would win silently) and
        any alias: ``*name`` repeats a node, so a kilobyte of nested aliases ("billion
        laughs") is a graph of 9^9 leaves that every later walk expands. Refused while the
        document is composed, before anything is built from it."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise ConfigError(
                    f"recipe {path} line {event.start_mark.line + 1}: the YAML alias "
                    f"*{event.anchor} repeats another node; recipes may not use anchors and "
                    f"aliases (&name, *name, <<: *name), write the values out")
            return super().compose_node(parent, index)

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node)
            if key in seen:
                raise ConfigError(f"recipe {path} line {key_node.start_mark.line + 1}: the key "
                                  f"{key!r} appears twice in one mapping")
            seen[key] = loader.construct_object(value_node)
        return seen

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {e}") from e
    except ConfigError:
        raise
    except ValueError as e:  # an integer of more than 4,300 digits
        raise ConfigError(f"recipe {path} holds a value YAML cannot read: {e}") from None
    except RecursionError:
        raise ConfigError(f"recipe {path} is nested deeper than {MAX_DEPTH} levels; no "
                          f"datalane file is") from None


def _resolve_relative(recipe: Recipe, base: str) -> Recipe:
    """Relative local paths in a recipe file are relative to the file, not the cwd."""
    import dataclasses

    def fix(uri: str) -> str:
        if "://" in uri or os.path.isabs(uri):
            return uri
        return os.path.normpath(os.path.join(base, uri))

    def fixed(s: Source) -> Source:
        config = s.kind_config
        changes: dict[str, Any] = {"uris": [fix(u) for u in s.uris]}
        if config is not None and hasattr(config, "resolved"):  # a kind's own file fields
            name = next(f.name for f in dataclasses.fields(s) if getattr(s, f.name) is config)
            changes[name] = config.resolved(fix)
        return dataclasses.replace(s, **changes)

    sources = [fixed(s) for s in recipe.sources]
    streams = [dataclasses.replace(e, sources=[fixed(s) for s in e.sources])
               for e in recipe.eval]
    tok = dataclasses.replace(recipe.tokenizer, uri=fix(recipe.tokenizer.uri))
    return dataclasses.replace(recipe, sources=sources, tokenizer=tok, eval=streams)
