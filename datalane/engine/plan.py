"""The plan: which chunks each lane reads, in which order (docs/architecture.md, One lane).

Per source, every file is listed and cut into chunks; per ``(source, epoch)`` the chunks are
permuted by a key of ``(seed, source, epoch)`` and dealt round-robin to lanes, so lane ``l``
reads chunks ``perm[l], perm[l+L], ...``. A plan is built once per process and shared by all
lanes in it; it also produces the fingerprint document.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from datalane.engine.chunks import Chunk, cut_file
from datalane.engine.documents import DocumentKind, kind_for, kind_name
from datalane.engine.files import SourceFile, compression_of, expand, format_of
from datalane.engine.formats import FORMATS
from datalane.engine.formats.directories import directory_lister, listed_format
from datalane.engine.mapstage import MapStage
from datalane.engine.rng import permutation
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.codepolicy import CodePolicy
from datalane.spec.errors import ConfigError
from datalane.spec.evals import training_view
from datalane.spec.fingerprint import fingerprint_of
from datalane.spec.formats import unsupported_compression
from datalane.spec.recipe import Filters, Recipe, Source
from datalane.spec.schema import Column, SampleSchema, text_schema
from datalane.spec.visioncontract import VisionContract

__all__ = ["Plan", "SourcePlan"]


@dataclass
class SourcePlan:
    """One source: its files, its chunks and how they are dealt to lanes."""

    index: int
    source: Source
    filters: Filters
    files: list[SourceFile]
    chunks: list[Chunk]
    seed: int
    lanes: int
    kind: DocumentKind
    _perms: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def _perm(self, epoch: int) -> list[int]:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = permutation(len(self.chunks), self.seed, "chunks", self.source.name, epoch)
            if len(self._perms) > 4:
                self._perms.clear()
            self._perms[epoch] = perm
        return perm

    def lane_chunks(self, lane: int, epoch: int) -> list[Chunk]:
        """The chunks lane ``lane`` reads in ``epoch``, in reading order."""
        perm = self._perm(epoch)
        return [self.chunks[perm[i]] for i in range(lane, len(perm), self.lanes)]


@dataclass
class Plan:
    """Everything a lane needs that is derived from the recipe and the files it names."""

    recipe: Recipe
    sources: list[SourcePlan]
    tokenizer: TokenizerHandle
    schema: SampleSchema
    fingerprint_doc: dict[str, object]
    fingerprint: str

    @classmethod
    def build(cls, recipe: Recipe) -> Plan:
        tokenizer = TokenizerHandle.load(recipe.tokenizer)
        kinds = [kind_for(s, tokenizer, f"sources[{i}]") for i, s in enumerate(recipe.sources)]
        sources = [_plan_source(i, s, recipe, kinds[i]) for i, s in enumerate(recipe.sources)]
        extra: dict[str, Column] = {}
        for i, kind in enumerate(kinds):
            for c in kind.columns:
                had = extra.setdefault(c.name, c)
                if had != c:  # (vision sources cutting patches of another size)
                    raise ConfigError(
                        f"sources[{i}] gives the sample column {c.name!r} as {c.to_json()}; "
                        f"an earlier source gives it as {had.to_json()}: every source of a "
                        f"recipe must agree")
        doc: dict[str, object] = {
            "recipe": training_view(recipe).to_dict(),  # eval streams: their own
            "files": {sp.source.name: [[f.uri, f.size, f.ident] for f in sp.files]
                      for sp in sources},
            "tokenizer_sha256": tokenizer.sha256,
        }
        identities = {sp.source.name: {"kind": kind_name(sp.source), **sp.kind.identity()}
                      for sp in sources if kind_name(sp.source) != "text"}
        if identities:  # text recipes keep the fingerprint they always had
            doc["documents"] = identities
        # compressed files cut at frame boundaries: a state saved when each was one chunk must
        # not resume on other chunks (recipes without such files keep their fingerprint)
        framed = {sp.source.name: {sp.files[i].uri: n for i, n in sorted(Counter(
            c.file for c in sp.chunks if sp.files[c.file].compression).items()) if n > 1}
            for sp in sources}
        if any(framed.values()):
            doc["compressed_chunks"] = {k: v for k, v in framed.items() if v}
        schema = text_schema(tokenizer.pad_id, tuple(extra.values()), _vision(sources))
        return cls(recipe, sources, tokenizer, schema, doc, fingerprint_of(doc))

    def map_stages(self, policy: CodePolicy | None = None) -> list[MapStage]:
        """One map stage per source (stateless: a loader's lanes share them); every filter
        predicate is checked against ``policy`` (default: ``$DATALANE_PREDICATE_MODULES``)
        before any is imported."""
        policy = policy if policy is not None else CodePolicy.from_env()
        policy.check_recipe(self.recipe)
        columns = self.schema.document_columns()
        whole = self.recipe.sequence_tokens  # for kinds whose documents are never split
        return [MapStage(sp.source.field, sp.filters, sp.kind, columns, policy,
                         whole if getattr(sp.source.kind_config, "whole_documents", False)
                         else None, sp.seed, sp.source.name)
                for sp in self.sources]


def _vision(sources: list[SourcePlan]) -> VisionContract | None:
    """The recipe's vision contract (None without images): every source that renders images
    must give the same one, since one batch of the model has one set of vision tokens and
    one patch rule (ConfigError naming the two sources)."""
    found = [(sp.source.name, sp.kind.vision) for sp in sources if sp.kind.vision is not None]
    for name, contract in found[1:]:
        first, now = found[0][1].to_dict(), contract.to_dict()
        differ = [f"{k} {first[k]!r} and {now[k]!r}" for k in first if first[k] != now[k]]
        if differ:
            raise ConfigError(f"sources {found[0][0]!r} and {name!r} give different vision "
                              f"tokens or patching ({', '.join(differ)}): one batch of the "
                              f"model has one set of vision tokens and one patch rule")
    return found[0][1] if found else None


def _plan_source(index: int, spec: Source, recipe: Recipe, kind: DocumentKind) -> SourcePlan:
    where = f"sources[{index}]"
    files: list[SourceFile] = []
    seen: set[str] = set()
    for j, uri in enumerate(spec.uris):
        listed = expand(uri, f"{where}.uris[{j}]", directory_lister(spec.format))
        for path, size, ident in listed:
            # one local file named twice ('/d/./a.jsonl', '/d/a.jsonl', a symlink) is read once
            key = path if "://" in path else os.path.realpath(path)
            if key in seen:
                continue
            seen.add(key)
            packed = unsupported_compression(path)
            if packed is not None:
                raise ConfigError(
                    f"{where}.uris[{j}]: {path} is compressed with {packed}, which datalane "
                    f"does not read (it reads gzip .gz and zstd .zst); recompress the file")
            fmt = format_of(path, spec.format or listed_format(ident), where)
            files.append(SourceFile(path, size, ident, fmt, compression_of(path)))
    chunks: list[Chunk] = []
    for i, sf in enumerate(files):
        chunks.extend(cut_file(i, sf, spec.chunk_bytes, spec.chunk_rows, spec))
    if not chunks:
        raise ConfigError(
            f"{where} {spec.name!r} has no data: its {len(files)} file(s) are empty "
            f"({', '.join(f.uri for f in files[:3])}{', ...' if len(files) > 3 else ''})")
    if len(chunks) < recipe.lanes:
        hints = dict.fromkeys(FORMATS[f.format].fewer_chunks_hint(files, where) for f in files)
        smaller = "; or ".join(hints)
        raise ConfigError(
            f"{where} {spec.name!r} has {len(chunks)} chunk(s) in {len(files)} file(s), but "
            f"{recipe.lanes} lanes each need at least one per epoch; {smaller}, or use fewer "
            f"lanes")
    return SourcePlan(index, spec, recipe.filters_for(spec), files, chunks, recipe.seed,
                      recipe.lanes, kind)

