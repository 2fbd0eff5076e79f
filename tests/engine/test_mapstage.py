"""The map stage (decode, filter, tokenize) and the tokenizer handle, with the real tokenizer."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from datalane.corpus import tokenizer_path
from datalane.engine.chunks import MISSING
from datalane.engine.documents.text import TextKind
from datalane.engine.formats import FORMATS
from datalane.engine.mapstage import BAD_RECORD_REASONS, MapResult, MapStage, Record
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import ConfigError, MismatchError
from datalane.spec.recipe import Filters, TokenizerSpec

JSONL = [FORMATS["jsonl"], FORMATS["parquet"]]  # file 0 holds JSON lines, file 1 Parquet values


def text_stage(field: str, filters: Filters, handle: TokenizerHandle) -> MapStage:
    return MapStage(field, filters, TextKind(handle, field))
EOS = 1  # the id of <|eos|> in the bundled tokenizer (checked below)


@pytest.fixture(scope="module")
def raw_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(tokenizer_path())


@pytest.fixture(scope="module")
def handle() -> TokenizerHandle:
    return TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path()))


def ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def line(text: Any, field: str = "text") -> bytes:
    return json.dumps({field: text}).encode()


def docs(result: MapResult) -> list[list[int] | None]:
    """Per record: its tokens, or None when it was set aside."""
    return [
        None if status is not None
        else result.tokens[result.offsets[i]:result.offsets[i + 1]].tolist()
        for i, status in enumerate(result.status)
    ]


def check_layout(result: MapResult, n: int) -> None:
    assert len(result.status) == len(result.detail) == n
    assert result.offsets.shape == (n + 1,)
    assert result.offsets[0] == 0
    assert result.offsets[-1] == result.tokens.size
    assert str(result.tokens.dtype) == "int32"
    for i, status in enumerate(result.status):
        if status is not None:  # set-aside records take no tokens
            assert result.offsets[i] == result.offsets[i + 1]


# -- statuses -------------------------------------------------------------------------------------


def test_bad_jsonl_records_get_their_reason_and_detail(handle: TokenizerHandle) -> None:
    records: list[Record] = [
        (0, 0, line("hello world")),
        (0, 10, b'{"text": "unterminated'),
        (0, 20, b'["a", "list"]'),
        (0, 30, b'"just a string"'),
        (0, 40, b'{"text": "caf\xe9"}'),
        (0, 50, line("x", field="body")),
        (0, 60, b'{"text": null}'),
        (0, 70, line(42)),
        (0, 80, line(["a"])),
        (0, 90, line("")),
        (0, 99, line("the end")),
    ]
    result = text_stage("text", Filters(), handle).run(records, JSONL)
    check_layout(result, len(records))
    assert result.status == [None, "malformed_json", "malformed_json", "malformed_json",
                             "non_utf8", "missing_field", "missing_field", "not_text",
                             "not_text", "empty_text", None]
    assert result.detail == [
        None,
        "malformed JSON (Unterminated string starting at: column 10)",
        "a JSON list, not an object",
        "a JSON str, not an object",
        "invalid UTF-8 at byte 13 of the line",
        "no field 'text'",
        "no field 'text'",
        "field 'text' holds int",
        "field 'text' holds list",
        "field 'text' is empty",
        None,
    ]
    assert set(s for s in result.status if s) <= BAD_RECORD_REASONS


def test_bad_raw_values_get_their_reason_and_detail(handle: TokenizerHandle) -> None:
    records: list[Record] = [
        (1, 0, "plain text"),
        (1, 1, MISSING),
        (1, 2, None),
        (1, 3, b"\xff\xfebytes"),
        (1, 4, b"valid bytes"),
        (1, 5, 3.5),
        (1, 6, ""),
    ]
    result = text_stage("body", Filters(), handle).run(records, JSONL)
    check_layout(result, len(records))
    assert result.status == [None, "missing_field", "missing_field", "non_utf8", None,
                             "not_text", "empty_text"]
    assert result.detail == [None, "no value in field 'body'", "no value in field 'body'",
                             "invalid UTF-8 at byte 0 of the value", None,
                             "field 'body' holds float", "field 'body' is empty"]


def test_text_field_selects_the_key(handle: TokenizerHandle, raw_tokenizer: Tokenizer) -> None:
    rec = (0, 0, b'{"text": "not me", "content": "me"}')
    result = text_stage("content", Filters(), handle).run([rec], JSONL)
    assert docs(result) == [ids(raw_tokenizer, "me") + [EOS]]


def test_char_filters_are_inclusive_bounds(handle: TokenizerHandle) -> None:
    texts = ["abc", "abcd", "abcdefgh", "abcdefghi", "ééé"]  # characters, not bytes
    records: list[Record] = [(1, i, t) for i, t in enumerate(texts)]
    result = text_stage("text", Filters(min_chars=4, max_chars=8), handle).run(records, JSONL)
    assert result.status == ["min_chars", None, None, "max_chars", "min_chars"]
    result = text_stage("text", Filters(min_chars=3, max_chars=3), handle).run(records, JSONL)
    assert result.status == [None, "max_chars", "max_chars", "max_chars", None]


def test_token_filters_count_tokens_without_bos_and_eos(
        handle: TokenizerHandle, raw_tokenizer: Tokenizer) -> None:
    texts = ["a", "hello world", "the quick brown fox jumps over the lazy dog " * 3]
    lengths = [len(ids(raw_tokenizer, t)) for t in texts]
    assert lengths[0] < lengths[1] < lengths[2]
    records: list[Record] = [(0, i, line(t)) for i, t in enumerate(texts)]
    stage = text_stage("text", Filters(min_tokens=lengths[1], max_tokens=lengths[1]), handle)
    result = stage.run(records, JSONL)
    check_layout(result, 3)
    assert result.status == ["min_tokens", None, "max_tokens"]
    assert docs(result) == [None, ids(raw_tokenizer, texts[1]) + [EOS], None]
    # one token less on either side lets the neighbours through
    stage = text_stage("text", Filters(min_tokens=lengths[0], max_tokens=lengths[2]), handle)
    assert stage.run(records, JSONL).status == [None, None, None]


def _predicate_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"dl_pred_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_predicate_by_import_path(handle: TokenizerHandle, raw_tokenizer: Tokenizer,
                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _predicate_module(tmp_path, monkeypatch,
                               "def keep(text):\n    return 'keep' in text\n")
    stage = text_stage("text", Filters(predicate=f"{module}:keep"), handle)
    texts = ["please keep me", "drop me", "keep", "KEEP"]
    result = stage.run([(0, i, line(t)) for i, t in enumerate(texts)], JSONL)
    assert result.status == [None, "predicate", None, "predicate"]
    assert docs(result) == [ids(raw_tokenizer, texts[0]) + [EOS], None,
                            ids(raw_tokenizer, texts[2]) + [EOS], None]


def test_predicate_sees_only_texts_that_passed_the_char_filters(
        handle: TokenizerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _predicate_module(tmp_path, monkeypatch,
                               "seen = []\n"
                               "def keep(text):\n    seen.append(text)\n    return True\n")
    stage = text_stage("text", Filters(min_chars=3, predicate=f"{module}:keep"), handle)
    stage.run([(0, 0, line("ab")), (0, 1, b"{bad"), (0, 2, line("abc"))], JSONL)
    assert sys.modules[module].seen == ["abc"]


@pytest.mark.parametrize(("body", "path", "message"), [
    ("", "{module}:keep",
     "filters.predicate '{module}:keep' cannot be imported: module '{module}' has no "
     "attribute 'keep'"),
    ("keep = 3\n", "{module}:keep", "filters.predicate '{module}:keep' is not callable"),
    ("", "dl_no_such_module_xyz:keep",
     "filters.predicate 'dl_no_such_module_xyz:keep' cannot be imported: No module named "
     "'dl_no_such_module_xyz'"),
])
def test_bad_predicate_path_is_named_in_the_error(
        handle: TokenizerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        body: str, path: str, message: str) -> None:
    module = _predicate_module(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigError) as info:
        text_stage("text", Filters(predicate=path.format(module=module)), handle)
    assert str(info.value) == message.format(module=module)


# -- tokens ---------------------------------------------------------------------------------------

TEXTS = [
    "hello world",
    "Ünïcödé and emoji 🎉 are bytes too",
    "a",
    "    leading spaces\nand a newline\tand a tab",
    "the quick brown fox " * 40,
    "<|eos|> written in the text is just text",
]


@pytest.mark.parametrize(("add_bos", "add_eos"), [(False, True), (True, True), (True, False),
                                                  (False, False)])
def test_kept_tokens_equal_a_direct_encode_plus_the_policy(
        raw_tokenizer: Tokenizer, add_bos: bool, add_eos: bool) -> None:
    handle = TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path(), add_bos=add_bos,
                                                add_eos=add_eos))
    bos, eos = raw_tokenizer.token_to_id("<|bos|>"), raw_tokenizer.token_to_id("<|eos|>")
    assert bos is not None and eos is not None
    head: list[int] = [bos] if add_bos else []
    tail: list[int] = [eos] if add_eos else []
    assert (handle.bos_id, handle.eos_id) == (bos if add_bos else None,
                                              eos if add_eos else None)
    records: list[Record] = []
    for i, t in enumerate(TEXTS):
        records.append((0, i * 2, line(t)))
        records.append((1, i * 2 + 1, t))
    records.insert(3, (0, 999, b"not json"))  # a gap in the middle changes nothing
    result = text_stage("text", Filters(), handle).run(records, JSONL)
    check_layout(result, len(records))
    want: list[list[int] | None] = []
    for t in TEXTS:
        body = head + ids(raw_tokenizer, t) + tail
        want += [body, body]
    want.insert(3, None)
    assert docs(result) == want
    assert result.status[3] == "malformed_json"


def test_batched_run_equals_one_record_at_a_time(handle: TokenizerHandle) -> None:
    records: list[Record] = [(0, i, line(t)) for i, t in enumerate(TEXTS * 5)]
    records += [(0, 100, b"{oops"), (1, 101, ""), (1, 102, "last")]
    stage = text_stage("text", Filters(min_chars=2), handle)
    batched = stage.run(records, JSONL)
    single = [stage.run([r], JSONL) for r in records]
    assert batched.status == [s.status[0] for s in single]
    assert docs(batched) == [docs(s)[0] for s in single]


def test_empty_slice(handle: TokenizerHandle) -> None:
    result = text_stage("text", Filters(), handle).run([], JSONL)
    check_layout(result, 0)
    assert result.tokens.size == 0


def test_all_records_filtered(handle: TokenizerHandle) -> None:
    result = text_stage("text", Filters(min_tokens=10_000), handle).run(
        [(1, 0, "short"), (1, 1, "also short")], JSONL)
    check_layout(result, 2)
    assert result.status == ["min_tokens", "min_tokens"]
    assert result.tokens.size == 0


# -- tokenizer handle -----------------------------------------------------------------------------


def test_handle_hash_and_special_ids(handle: TokenizerHandle, raw_tokenizer: Tokenizer) -> None:
    with open(tokenizer_path(), "rb") as f:
        assert handle.sha256 == hashlib.sha256(f.read()).hexdigest()
    assert handle.eos_id == raw_tokenizer.token_to_id("<|eos|>") == EOS
    assert handle.bos_id is None  # add_bos is off by default
    assert handle.pad_id == handle.eos_id  # pad_token null means EOS
    padded = TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path(), pad_token="<|pad|>"))
    assert padded.pad_id == raw_tokenizer.token_to_id("<|pad|>") != handle.eos_id


def test_handle_loads_by_file_uri_with_a_correct_pin(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_path(), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    handle = TokenizerHandle.load(TokenizerSpec(uri=f"file://{path}", sha256=digest))
    assert handle.sha256 == digest
    assert handle.encode(["hello"])[0].tolist() == TokenizerHandle.load(
        TokenizerSpec(uri=tokenizer_path())).encode(["hello"])[0].tolist()


def test_missing_tokenizer_file_names_the_uri(tmp_path: Path) -> None:
    uri = str(tmp_path / "nope" / "tokenizer.json")
    with pytest.raises(ConfigError) as info:
        TokenizerHandle.load(TokenizerSpec(uri=uri))
    assert str(info.value) == f"tokenizer.uri {uri!r} does not exist"
    with pytest.raises(ConfigError) as info:
        TokenizerHandle.load(TokenizerSpec(uri=str(tmp_path)))
    assert str(info.value) == (
        f"tokenizer.uri {str(tmp_path)!r} is a directory; point it at tokenizer.json")
    with pytest.raises(ConfigError) as info:
        TokenizerHandle.load(TokenizerSpec(uri="nosuch://tok.json"))
    assert str(info.value) == (
        "tokenizer.uri 'nosuch://tok.json' cannot be opened: Protocol not known: nosuch")


def test_sha256_pin_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    shutil.copyfile(tokenizer_path(), path)
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    pin = "0" * 64
    with pytest.raises(MismatchError) as info:
        TokenizerHandle.load(TokenizerSpec(uri=str(path), sha256=pin))
    assert str(info.value) == f"tokenizer.sha256 pins {pin}, but {path} has SHA-256 {actual}"


def test_not_a_tokenizer_file(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError) as info:
        TokenizerHandle.load(TokenizerSpec(uri=str(path)))
    assert str(info.value).startswith(f"tokenizer.uri {str(path)!r} is not a valid "
                                      f"tokenizer.json: ")


@pytest.mark.parametrize(("spec", "message"), [
    ({"add_bos": True, "bos_token": "<s>"}, "tokenizer.bos_token '<s>' is not in the vocabulary"),
    ({"eos_token": "</s>"}, "tokenizer.eos_token '</s>' is not in the vocabulary"),
    ({"pad_token": "[PAD]"}, "tokenizer.pad_token '[PAD]' is not in the vocabulary"),
    ({"add_eos": False, "eos_token": "</s>"},
     "tokenizer.eos_token '</s>' is not in the vocabulary"),  # still the pad token
])
def test_special_token_missing_from_the_vocabulary(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path(), **spec))
    assert str(info.value) == f"{message} of {tokenizer_path()}"


def test_bos_name_is_not_needed_when_bos_is_off() -> None:
    handle = TokenizerHandle.load(TokenizerSpec(uri=tokenizer_path(), bos_token="<s>"))
    assert handle.bos_id is None


def _with_padding_and_truncation(source: str, path: Path) -> Path:
    """A copy of the tokenizer.json at ``source`` whose file asks for padding to the
    longest of a batch and truncation to 3 tokens (as some published tokenizer.json do)."""
    tok = Tokenizer.from_file(source)
    tok.enable_padding(pad_id=0, pad_token=tok.id_to_token(0))
    tok.enable_truncation(max_length=3)
    text = tok.to_str()
    assert json.loads(text)["padding"] and json.loads(text)["truncation"]
    path.write_text(text)
    return path


def test_a_tokenizer_files_padding_and_truncation_never_apply(
        tmp_path: Path, handle: TokenizerHandle, raw_tokenizer: Tokenizer) -> None:
    # Padded to a batch's longest, a document's ids would depend on which map task (cut by
    # timing) it was encoded in; truncated, it would lose tokens. Both are dropped at load.
    path = _with_padding_and_truncation(tokenizer_path(), tmp_path / "tokenizer.json")
    loaded = TokenizerHandle.load(TokenizerSpec(uri=str(path)))
    texts = ["hello", "hello world this is a longer document"]
    want = [raw_tokenizer.encode(t, add_special_tokens=False).ids + [EOS] for t in texts]
    assert len(want[1]) > len(want[0]) + 1 and len(want[1]) > 4
    for batch in ([texts[0]], [texts[1]], texts, texts[::-1]):
        ids, offsets, _ = loaded.encode(batch)
        got = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(batch))]
        assert got == [want[texts.index(t)] for t in batch], (
            f"the same ids whatever the batch, as without the file's padding: {got}")
    # the identity is still the file's bytes (this file is another file)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() != handle.sha256
