"""Pre-tokenized sources, piece by piece: the tokens kind, the Megatron index, flat token files
and the Parquet integer-list fast path.

Every expectation is written out by hand from the documented layouts (``docs/recipe.md``,
the format modules' docstrings); the Megatron writer is checked byte for byte against
megatron-core's own ``IndexedDatasetBuilder`` in
``tests/engine/formats/test_tokens_sources.py`` (importing megatron-core takes 10 s, too long
for this tier).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datalane.corpus import tokenizer_path
from datalane.engine.chunks import Chunk, RecordReader, cut_file
from datalane.engine.documents import kind_for
from datalane.engine.documents.tokens import TokensKind, check_ids
from datalane.engine.files import SourceFile, expand
from datalane.engine.formats.flatbin import offsets_path, write_flat
from datalane.engine.formats.megatron import MAGIC, read_index, write_dataset
from datalane.engine.formats.tokenfile import cut_documents
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec.errors import ConfigError, DataError
from datalane.spec.recipe import Source, TokenizerSpec, load_recipe
from datalane.spec.tokens import TokensSpec

VOCAB = 1024  # the bundled tokenizer: ids 0..1023 (<|bos|> 0, <|eos|> 1, <|pad|> 2)


@pytest.fixture(scope="module")
def tokenizer() -> TokenizerHandle:
    return TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path()))


def source_file(path: Path, fmt: str) -> SourceFile:
    ((uri, size, ident),) = expand(str(path), "test")
    return SourceFile(uri, size, ident, fmt, None)


def tokens_source(uris: list[str], fmt: str | None = None, **tokens: object) -> Source:
    data: dict[str, object] = {"name": "ids", "uris": uris, "tokens": tokens}
    if fmt is not None:
        data["format"] = fmt
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 8,
                          "tokenizer": {"uri": tokenizer_path()}, "sources": [data]})
    return recipe.sources[0]


def read_all(reader: RecordReader, chunks: list[Chunk]) -> list[tuple[int, list[int]]]:
    return [(pos, np.asarray(raw).tolist()) for ch in chunks for pos, raw in reader.records(ch)]


# -- the tokens kind -------------------------------------------------------------------------

@pytest.mark.parametrize("value", [[5, 0, 1023], np.array([5, 0, 1023], np.uint16),
                                   np.array([5, 0, 1023], np.int32),
                                   np.array([5, 0, 1023], np.int64), (5, 0, 1023)])
def test_valid_ids_pass_as_they_are(value: object) -> None:
    ids, reason, _ = check_ids(value, VOCAB, "input_ids")
    assert reason == ""
    assert ids is not None and ids.tolist() == [5, 0, 1023]


@pytest.mark.parametrize("value,reason,detail", [
    ([5, 1024, 7], "token_out_of_range",
     "token id 1024 at index 1 is outside the vocabulary [0, 1024) of the tokenizer"),
    (np.array([3, 4, 70000], np.uint32), "token_out_of_range",
     "token id 70000 at index 2 is outside the vocabulary [0, 1024)"),
    (np.array([3, -1, 4], np.int32), "token_out_of_range", "token id -1 at index 1"),
    ([3, -(1 << 40)], "token_out_of_range", f"token id {-(1 << 40)} at index 1"),
    ([3, 1 << 70], "token_out_of_range", f"token id {1 << 70} at index 1"),
    ([], "empty_ids", "field 'input_ids' holds no token ids"),
    (np.zeros(0, np.uint16), "empty_ids", "holds no token ids"),
    ("hello", "not_tokens", "field 'input_ids' holds str, not a list of token ids"),
    ([1, None, 2], "not_tokens", "holds a null among its token ids"),
    ([1, 2.5], "not_tokens", "holds a float among its token ids"),
    ([True, False], "not_tokens", "holds a bool among its token ids"),
    ([[1, 2], [3]], "not_tokens", "holds a list among its token ids"),
    (np.array([1.0, 2.0]), "not_tokens", "holds a float64 array"),
    (np.array([[1, 2]], np.int32), "not_tokens", "of shape (1, 2)"),
    ({"ids": [1]}, "not_tokens", "holds dict"),
])
def test_bad_ids_are_bad_records_naming_the_problem(value: object, reason: str,
                                                    detail: str) -> None:
    ids, got, why = check_ids(value, VOCAB, "input_ids")
    assert ids is None and got == reason
    assert detail in why


def test_the_id_space_is_the_largest_id_plus_one_and_render_has_no_text(
        tokenizer: TokenizerHandle) -> None:
    kind = TokensKind(TokensSpec(), tokenizer)
    assert kind.vocab_size == VOCAB
    assert kind.has_text is False
    assert kind.bad_reasons == {"not_tokens", "token_out_of_range", "empty_ids"}
    doc, reason, _ = kind.render(np.array([1023], np.uint16))
    assert reason is None and doc is not None and doc.text == ""
    assert kind.render([1024])[1] == "token_out_of_range"


def test_tokenize_concatenates_into_int32_with_no_special_tokens_by_default(
        tokenizer: TokenizerHandle) -> None:
    kind = TokensKind(TokensSpec(), tokenizer)
    docs = [kind.render(v)[0] for v in ([7, 8, 9], np.array([10], np.uint16), [11, 12])]
    cols, offsets, lengths = kind.tokenize([d for d in docs if d is not None])
    assert cols["input_ids"].dtype == np.int32
    assert cols["input_ids"].tolist() == [7, 8, 9, 10, 11, 12]
    assert offsets.tolist() == [0, 3, 4, 6]
    assert lengths.tolist() == [3, 1, 2]


def test_add_bos_and_add_eos_wrap_every_document(tokenizer: TokenizerHandle) -> None:
    kind = TokensKind(TokensSpec(add_bos=True, add_eos=True), tokenizer)
    docs = [kind.render(v)[0] for v in ([7, 8], [9])]
    cols, offsets, lengths = kind.tokenize([d for d in docs if d is not None])
    assert cols["input_ids"].tolist() == [0, 7, 8, 1, 0, 9, 1]  # <|bos|> 0, <|eos|> 1
    assert offsets.tolist() == [0, 4, 7]
    assert lengths.tolist() == [2, 1], "token filters see the ids without BOS/EOS"
    eos_only = TokensKind(TokensSpec(add_eos=True), tokenizer)
    cols, _, _ = eos_only.tokenize([d for d in docs if d is not None])
    assert cols["input_ids"].tolist() == [7, 8, 1, 9, 1]


def test_a_special_token_missing_from_the_vocabulary_is_a_config_error(
        tokenizer: TokenizerHandle) -> None:
    import dataclasses

    odd = dataclasses.replace(tokenizer, spec=TokenizerSpec(uri=tokenizer_path(),
                                                            eos_token="<|end|>"))
    with pytest.raises(ConfigError, match=r"sources\[0\].tokens.add_eos adds '<\|end\|>'"):
        TokensKind(TokensSpec(add_eos=True), odd, "sources[0].tokens")


def test_a_source_is_one_kind(tokenizer: TokenizerHandle) -> None:
    from datalane.spec.chat import ChatSpec

    both = Source(name="x", uris=["a"], chat=ChatSpec(), tokens=TokensSpec())
    with pytest.raises(ConfigError, match="sets chat and tokens"):
        kind_for(both, tokenizer, "sources[0]")
    assert Source(name="x", uris=["a"], tokens=TokensSpec(field="ids")).field == "ids"


# -- the recipe --------------------------------------------------------------------------------

def test_token_formats_need_the_tokens_kind_at_load() -> None:
    base = {"lanes": 1, "global_batch_size": 1, "seq_len": 8,
            "tokenizer": {"uri": tokenizer_path()}}
    for source, fmt in (({"uris": ["/d/owt.idx"]}, "megatron"),
                        ({"uris": ["/d/train.bin"], "format": "flatbin"}, "flatbin"),
                        ({"uris": ["/d/*.u16"]}, "flatbin")):
        with pytest.raises(ConfigError) as e:
            load_recipe({**base, "sources": [{"name": "ids", **source}]})
        assert str(e.value) == (f"sources[0]: {fmt} files hold token ids, not text; set "
                                f"sources[0].tokens (for example `tokens: {{}}`) to read them")


def test_a_text_recipe_keeps_its_canonical_form() -> None:
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 8,
                          "tokenizer": {"uri": "t.json"},
                          "sources": [{"name": "web", "uris": ["a.parquet"]}]})
    assert "tokens" not in recipe.to_dict()["sources"][0]


# -- Megatron indexed datasets -------------------------------------------------------------------

DOCS = [[5, 6, 7], [8], [9, 10, 11, 12], [13, 14]]


def test_the_index_is_the_documented_layout(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    idx = (tmp_path / "d.idx").read_bytes()
    expected = (MAGIC + struct.pack("<QBQQ", 1, 8, 4, 5)
                + struct.pack("<4i", 3, 1, 4, 2)  # lengths
                + struct.pack("<4q", 0, 6, 8, 16)  # byte pointers (uint16: 2 bytes a token)
                + struct.pack("<5q", 0, 1, 2, 3, 4))  # document indices
    assert idx == expected
    assert (tmp_path / "d.bin").read_bytes() == np.arange(5, 15, dtype="<u2").tobytes()
    index = read_index(str(tmp_path / "d.idx"), str(tmp_path / "d.bin"), 20)
    assert index.starts.tolist() == [0, 3, 4, 8, 10]
    assert index.dtype == np.dtype("<u2")


def _megatron_records(tmp_path: Path, name: str, chunk_rows: int | None = None,
                      chunk_bytes: int = 1 << 20) -> tuple[list[Chunk], RecordReader]:
    src = tokens_source([str(tmp_path / f"{name}.idx")])
    sf = source_file(tmp_path / f"{name}.idx", "megatron")
    chunks = cut_file(0, sf, chunk_bytes, chunk_rows, src)
    return chunks, RecordReader([sf], src.field, src)


def test_documents_are_read_through_the_index(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    chunks, reader = _megatron_records(tmp_path, "d", chunk_rows=3)
    assert [(c.start, c.stop) for c in chunks] == [(0, 3), (3, 4)]
    assert read_all(reader, chunks) == list(enumerate(DOCS))
    assert next(iter(reader.records(chunks[0], start=2)))[0] == 2
    assert reader.read_one((0, 3)).tolist() == [13, 14]
    with pytest.raises(DataError, match="has 4 documents, no document 4"):
        reader.read_one((0, 4))


def test_sentence_split_documents_are_their_sequences_together(tmp_path: Path) -> None:
    # megatron-core with --split-sentences: several sequences (sentences) per document
    prefix = tmp_path / "s"
    (prefix.with_suffix(".bin")).write_bytes(np.arange(1, 8, dtype="<u2").tobytes())
    lengths, pointers, doc_index = [2, 1, 3, 1], [0, 4, 6, 12], [0, 2, 4]
    (prefix.with_suffix(".idx")).write_bytes(
        MAGIC + struct.pack("<QBQQ", 1, 8, 4, 3) + struct.pack("<4i", *lengths)
        + struct.pack("<4q", *pointers) + struct.pack("<3q", *doc_index))
    chunks, reader = _megatron_records(tmp_path, "s")
    assert read_all(reader, chunks) == [(0, [1, 2, 3]), (1, [4, 5, 6, 7])]


@pytest.mark.parametrize("chunk_bytes,bounds", [
    (1 << 20, [(0, 4)]),
    (8, [(0, 2), (2, 3), (3, 4)]),  # 4 uint16 tokens a chunk: starts 0, 3 | 4 | 8
    (2, [(0, 1), (1, 2), (2, 3), (3, 4)]),
])
def test_chunks_are_the_documents_starting_in_each_chunk_bytes(
        tmp_path: Path, chunk_bytes: int, bounds: list[tuple[int, int]]) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    chunks, reader = _megatron_records(tmp_path, "d", chunk_bytes=chunk_bytes)
    assert [(c.start, c.stop) for c in chunks] == bounds
    assert read_all(reader, chunks) == list(enumerate(DOCS))


def test_cut_documents_by_hand() -> None:
    starts = np.array([0, 10, 10, 25, 60, 61], np.int64)  # 5 documents, one empty
    assert [(c.start, c.stop) for c in cut_documents(0, starts, 4, 80, None)] == [
        (0, 3), (3, 4), (4, 5)]  # 20 tokens a chunk: marks 0, 20, 40, 60
    assert [(c.start, c.stop) for c in cut_documents(0, starts, 4, 80, 2)] == [
        (0, 2), (2, 4), (4, 5)]
    assert cut_documents(0, np.array([0], np.int64), 4, 80, None) == []
    # three documents start at token 5 (two empty), none after token 301: 100 tokens a chunk,
    # marks 0, 100, ..., 900 fall on documents 0, 4, 5, 5, then past the last
    starts = np.array([0, 5, 5, 5, 100, 300, 301, 1000], np.int64)
    assert [(c.start, c.stop) for c in cut_documents(0, starts, 2, 200, None)] == [
        (0, 4), (4, 5), (5, 7)]


def test_a_damaged_index_is_a_data_error_naming_it(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    good = (tmp_path / "d.idx").read_bytes()
    idx, bin_ = str(tmp_path / "d.idx"), str(tmp_path / "d.bin")
    cases = [
        (good[:20], "shorter than the 34-byte header"),
        (b"XXXXXXXXX" + good[9:], "not the magic"),
        (good[:9] + struct.pack("<Q", 2) + good[17:], "version 2"),
        (good[:17] + b"\x06" + good[18:], "stores float64 tokens"),
        (good[:17] + b"\x09" + good[18:], "unknown token type code 9"),
        (good[:-8], "114 bytes, but 4 sequences and 5 document indices need 122"),
        (good[:34 + 16 + 8] + struct.pack("<q", 7) + good[34 + 16 + 16:],
         "sequence 1 starts at byte 7 of the .bin"),
    ]
    for data, message in cases:
        (tmp_path / "d.idx").write_bytes(data)
        with pytest.raises(DataError, match=message) as e:
            read_index(idx, bin_, 20)
        assert idx in str(e.value)
    (tmp_path / "d.idx").write_bytes(good)
    with pytest.raises(DataError, match=r"d.bin has 18 bytes, but its index .* describes 10 "
                                        r"uint16 tokens \(20 bytes\)"):
        read_index(idx, bin_, 18)


def test_a_dataset_without_its_bin_is_a_config_error(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    (tmp_path / "d.bin").unlink()
    src = tokens_source([str(tmp_path / "d.idx")])
    with pytest.raises(ConfigError, match=r"d.idx is a Megatron dataset without its bin file"):
        cut_file(0, source_file(tmp_path / "d.idx", "megatron"), 1 << 20, None, src)


def test_the_declared_dtype_must_be_the_index_s(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "int32")
    src = tokens_source([str(tmp_path / "d.idx")], dtype="uint16")
    with pytest.raises(ConfigError, match=r"tokens.dtype is uint16, but .*d.idx stores int32"):
        cut_file(0, source_file(tmp_path / "d.idx", "megatron"), 1 << 20, None, src)


def test_a_text_source_cannot_read_a_token_format_even_when_globbed(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    text = Source(name="t", uris=[str(tmp_path / "*")])  # not inferable at load
    with pytest.raises(ConfigError, match="reads Megatron datasets, which hold token ids"):
        cut_file(0, source_file(tmp_path / "d.idx", "megatron"), 1 << 20, None, text)


# -- flat token files --------------------------------------------------------------------------

# documents ended by the boundary id 1; the last one has no boundary
FLAT = [[5, 6, 1], [1], [7, 8, 9, 10, 1], [11, 1], [12, 13]]


def _flat(tmp_path: Path, name: str, chunk_bytes: int, **tokens: object
          ) -> tuple[list[Chunk], RecordReader]:
    src = tokens_source([str(tmp_path / name)], "flatbin", **tokens)
    sf = source_file(tmp_path / name, "flatbin")
    return cut_file(0, sf, chunk_bytes, None, src), RecordReader([sf], src.field, src)


def test_boundary_documents_are_read_exactly_once_whatever_the_chunk_size(
        tmp_path: Path) -> None:
    write_flat(str(tmp_path / "f.bin"), FLAT, "uint16")
    starts = [0, 3, 4, 9, 11]  # token index of each document's first token
    for chunk_bytes in range(1, 32):
        chunks, reader = _flat(tmp_path, "f.bin", chunk_bytes, dtype="uint16", boundary=1)
        got = read_all(reader, chunks)
        assert got == list(zip(starts, FLAT, strict=True)), chunk_bytes


def test_boundary_documents_resume_at_a_position_and_read_one(tmp_path: Path) -> None:
    write_flat(str(tmp_path / "f.u32"), FLAT, "uint32")
    chunks, reader = _flat(tmp_path, "f.u32", 1 << 20, boundary=1)  # .u32: the width
    assert [(c.start, c.stop) for c in chunks] == [(0, 13)]
    assert [(p, np.asarray(r).tolist()) for p, r in reader.records(chunks[0], start=4)] == [
        (4, FLAT[2]), (9, FLAT[3]), (11, FLAT[4])]
    assert reader.read_one((0, 9)).tolist() == [11, 1]
    assert reader.read_one((0, 11)).tolist() == [12, 13]


def test_a_flat_document_longer_than_the_read_window(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from datalane.engine.formats import flatbin

    monkeypatch.setattr(flatbin, "WINDOW_BYTES", 4)  # two uint16 tokens a read
    write_flat(str(tmp_path / "f.bin"), FLAT, "uint16")
    chunks, reader = _flat(tmp_path, "f.bin", 6, dtype="uint16", boundary=1)
    assert read_all(reader, chunks) == list(zip([0, 3, 4, 9, 11], FLAT, strict=True))


def test_offsets_file_documents(tmp_path: Path) -> None:
    docs = [[5, 6], [], [7, 8, 9], [10]]  # an empty document is a record too
    write_flat(str(tmp_path / "f.bin"), docs, "uint32", offsets=True)
    assert offsets_path(str(tmp_path / "f.bin")) == str(tmp_path / "f.offsets.npy")
    assert np.load(tmp_path / "f.offsets.npy").tolist() == [0, 2, 2, 5, 6]
    chunks, reader = _flat(tmp_path, "f.bin", 8, dtype="uint32")  # 2 tokens a chunk
    # documents starting in tokens [0, 2): 0 | [2, 4): 1 and 2 | [4, 6): 3
    assert [(c.start, c.stop) for c in chunks] == [(0, 1), (1, 3), (3, 4)]
    assert read_all(reader, chunks) == list(enumerate(docs))
    assert reader.read_one((0, 2)).tolist() == [7, 8, 9]


@pytest.mark.parametrize("offsets,message", [
    ([0, 2, 5], "runs from 0 to 5, but its documents must cover the 6 tokens"),
    ([1, 2, 6], "runs from 1 to 6"),
    ([0, 4, 3, 6], r"offset 2 \(3\) is below offset 1 \(4\)"),
    ([[0, 6]], r"shape \(1, 2\)"),
])
def test_a_bad_offsets_file_is_a_data_error(tmp_path: Path, offsets: list[int],
                                            message: str) -> None:
    write_flat(str(tmp_path / "f.bin"), [[1, 2, 3, 4, 5, 6]], "uint16")
    np.save(tmp_path / "f.offsets.npy", np.array(offsets, np.int64))
    with pytest.raises(DataError, match=message):
        _flat(tmp_path, "f.bin", 1 << 20, dtype="uint16")


def test_flat_layout_errors_name_what_to_set(tmp_path: Path) -> None:
    write_flat(str(tmp_path / "f.bin"), FLAT, "uint16")
    with pytest.raises(ConfigError, match=r"set tokens.dtype \(uint16 or uint32\) to read the "
                                          r"flat token file .*f.bin"):
        _flat(tmp_path, "f.bin", 1 << 20, boundary=1)
    with pytest.raises(ConfigError, match=r"f.bin has no offsets file .*f.offsets.npy"):
        _flat(tmp_path, "f.bin", 1 << 20, dtype="uint16")
    write_flat(str(tmp_path / "g.u16"), FLAT, "uint16")
    with pytest.raises(ConfigError, match=r"tokens.dtype is uint32, but .*g.u16 is named as a "
                                          r"uint16 file"):
        _flat(tmp_path, "g.u16", 1 << 20, dtype="uint32", boundary=1)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError, match=r"odd.bin has 3 bytes, not a whole number of uint16"):
        _flat(tmp_path, "odd.bin", 1 << 20, dtype="uint16", boundary=1)


def test_a_truncated_token_file_is_an_error_not_a_shorter_document(tmp_path: Path) -> None:
    write_dataset(str(tmp_path / "d"), DOCS, "uint16")
    chunks, reader = _megatron_records(tmp_path, "d")
    (tmp_path / "d.bin").write_bytes((tmp_path / "d.bin").read_bytes()[:15])
    # the size listed with the index is checked when the .bin is opened (files.open_file)
    with pytest.raises(DataError, match=r"d.bin changed after the plan was made: the plan saw "
                                        r"20 bytes \(mtime=.*\), the file now has 15 bytes"):
        read_all(reader, chunks)


# -- Parquet integer-list columns -----------------------------------------------------------------

def test_parquet_id_lists_come_as_numpy_views_for_a_tokens_source(tmp_path: Path) -> None:
    rows = [[5, 6, 7], None, [], [8], [9, 10]]
    for typ in (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint16())):
        path = tmp_path / "ids.parquet"
        pq.write_table(pa.table({"input_ids": pa.array(rows, typ)}), path, row_group_size=2)
        sf = source_file(path, "parquet")
        src = tokens_source([str(path)])
        chunks = cut_file(0, sf, 1 << 20, None, src)
        got = [(p, r) for ch in chunks for p, r in RecordReader([sf], src.field, src).records(ch)]
        assert [p for p, _ in got] == [0, 1, 2, 3, 4]
        assert got[1][1] is None
        for (_, r), want in zip(got, rows, strict=True):
            if want is not None:
                assert isinstance(r, np.ndarray) and r.tolist() == want
        # a text source reading the same column keeps the Python values it always had
        text = Source(name="t", uris=[str(path)], text_field="input_ids")
        values = [r for ch in cut_file(0, sf, 1 << 20, None, text)
                  for _, r in RecordReader([sf], "input_ids", text).records(ch)]
        assert values == rows


def test_parquet_nulls_inside_a_list_go_the_slow_way_and_are_named(tmp_path: Path) -> None:
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[5, None], [6]], pa.list_(pa.int32()))}),
                   path)
    sf = source_file(path, "parquet")
    src = tokens_source([str(path)])
    [chunk] = cut_file(0, sf, 1 << 20, None, src)
    got = [r for _, r in RecordReader([sf], src.field, src).records(chunk)]
    assert got == [[5, None], [6]]
    assert check_ids(got[0], VOCAB, "input_ids")[1] == "not_tokens"


@pytest.mark.parametrize("values", [
    [np.array([1, 2], np.uint16), [3]],                          # a list among arrays
    [np.array([1, 2], np.uint16), np.array([], np.uint16)],      # an empty document
    [np.array([1, 2], np.uint16), np.array([[3, 4]], np.uint16)],  # a 2-D value
    [np.array([[1, 2]], np.uint16)],                             # only a 2-D value
    [np.array([[1], [2]], np.uint16)],                           # a column: 2 rows of 1
    [np.array([1, 2], np.uint16), np.array([[3]], np.uint16)],   # among 1-D ones
    [np.array(5, np.int32)],                                     # a 0-d value
    [np.array([1, 2], np.uint16), np.array([3.0])],              # floats
    [np.array([1], np.uint64), np.array([2], np.int64)],         # they mix into float64
    [np.array([1, -2], np.int32)],                               # a negative id
    [np.array([1, VOCAB], np.uint32)],                           # an id out of range
    [np.array([1], np.int8), np.array([-3], np.int8)],           # one signed type, widened
    [np.array([1, 2], np.uint8), np.array([-1], np.int8)],       # they mix into int16
    [np.array([3, VOCAB], np.uint16)],                           # widened, out of range
    [np.array([True, False])],                                   # booleans
    [],
])
def test_a_whole_task_is_checked_at_once_or_left_to_one_record_at_a_time(
        tokenizer: TokenizerHandle, values: list[object]) -> None:
    """``tokenize_values`` takes a map task's values in one pass when every one is a
    non-empty 1-D integer array of ids in range, and otherwise answers None, so that the
    records are checked one at a time and the bad one is named (never a wrong accept)."""
    kind = TokensKind(TokensSpec(), tokenizer)
    assert kind.tokenize_values(values) is None, f"{values} must go record by record"


def test_a_whole_task_in_one_pass_is_what_one_record_at_a_time_gives(
        tokenizer: TokenizerHandle) -> None:
    for spec in (TokensSpec(), TokensSpec(add_bos=True, add_eos=True),
                 TokensSpec(add_bos=True), TokensSpec(add_eos=True)):
        kind = TokensKind(spec, tokenizer)
        values = [np.array([7, 8, 9], np.uint16), np.array([10], np.uint16),
                  np.array([1023, 0], np.uint16)]
        got = kind.tokenize_values(values)
        assert got is not None
        want = kind.tokenize([kind.render(v)[0] for v in values])  # type: ignore[misc]
        for one, other in zip(got, want, strict=True):
            a = one["input_ids"] if isinstance(one, dict) else one
            b = other["input_ids"] if isinstance(other, dict) else other
            assert a.dtype == b.dtype and a.tolist() == b.tolist()


@pytest.mark.parametrize(("values", "ids"), [
    # ids of one type int32 holds are joined and widened in one pass
    ([np.array([7, 8, 9], np.uint16), np.array([1023], np.uint16)], [7, 8, 9, 1023]),
    ([np.array([0, 5], np.int16), np.array([6], np.int16)], [0, 5, 6]),
    ([np.array([4], np.uint8), np.array([255, 3], np.uint8)], [4, 255, 3]),
    # other types (uint32, a mix) are joined, checked, then cast, as before
    ([np.array([100, 200], np.uint32), np.array([1], np.uint32)], [100, 200, 1]),
    ([np.array([2, 3], np.uint8), np.array([4], np.int8)], [2, 3, 4]),
    ([np.array([12, 13], ">u2")], [12, 13]),  # big-endian ids: their values
    ([np.array([1, 2], np.int32), np.array([3], np.int32)], [1, 2, 3]),
    ([np.array([1, 2], ">i4")], [1, 2]),
    # values that are strided views (every other id of a column) join as well, alone or
    # among contiguous ones
    ([np.array([7, 0, 8, 0, 9], np.uint16)[::2]], [7, 8, 9]),
    ([np.array([5, 6], np.uint16), np.array([7, 0, 8], np.uint16)[::2],
      np.array([9], np.uint16)], [5, 6, 7, 8, 9]),
])
def test_a_whole_task_of_arrays_gives_the_ids_as_int32(
        tokenizer: TokenizerHandle, values: list[np.ndarray], ids: list[int]) -> None:
    kind = TokensKind(TokensSpec(), tokenizer)
    got = kind.tokenize_values(values)
    assert got is not None
    columns, offsets, lens = got
    assert columns["input_ids"].dtype == np.int32
    assert columns["input_ids"].tolist() == ids
    # the task's own array: writable, sharing no memory with the values it was joined from
    assert columns["input_ids"].flags.writeable
    assert not any(np.shares_memory(columns["input_ids"], v) for v in values)
    lengths = [len(v) for v in values]
    assert lens.tolist() == lengths
    assert offsets.tolist() == [0, *np.cumsum(lengths).tolist()]


@pytest.mark.parametrize("fmt", ["megatron", "flatbin", "parquet"])
def test_token_filters_set_aside_documents_of_a_whole_task(
        tokenizer: TokenizerHandle, fmt: str) -> None:
    """A task of token arrays goes to the kind whole (the formats pass arrays as they are);
    the token filters then set aside exactly the documents outside the bounds, with the
    offsets of the ones kept."""
    from datalane.engine.formats import FORMATS
    from datalane.engine.mapstage import MapStage
    from datalane.spec.recipe import Filters

    assert FORMATS[fmt].passes_arrays
    stage = MapStage("input_ids", Filters(min_tokens=3, max_tokens=5),
                     TokensKind(TokensSpec(), tokenizer))
    lengths = [2, 3, 5, 6, 4]
    records = [(0, k, np.arange(10, 10 + n, dtype=np.uint16)) for k, n in enumerate(lengths)]
    result = stage.run(records, [FORMATS[fmt]])
    assert result.status == ["min_tokens", None, None, "max_tokens", None]
    assert result.offsets.tolist() == [0, 0, 3, 8, 8, 12]
    assert result.bounds == [0, 0, 3, 8, 8, 12]
    assert result.set_aside == [0, 3]
    assert result.tokens.tolist() == [10, 11, 12, 10, 11, 12, 13, 14, 10, 11, 12, 13]


def test_a_task_with_a_raw_that_is_no_array_is_mapped_record_by_record(
        tokenizer: TokenizerHandle) -> None:
    """A raw record too large to hold (a TooLarge, not an array) among arrays: the task is
    not taken whole; the record is set aside as too_large and the others kept."""
    from datalane.engine.formats import FORMATS
    from datalane.engine.formats.base import TooLarge
    from datalane.engine.mapstage import MapStage
    from datalane.spec.recipe import Filters

    stage = MapStage("input_ids", Filters(), TokensKind(TokensSpec(), tokenizer))
    records = [(0, 0, np.array([5, 6], np.uint16)), (0, 2, TooLarge(1 << 30, "document")),
               (0, 3, np.array([7], np.uint16))]
    result = stage.run(records, [FORMATS["megatron"]])
    assert result.status == [None, "too_large", None]
    assert result.tokens.tolist() == [5, 6, 7]
