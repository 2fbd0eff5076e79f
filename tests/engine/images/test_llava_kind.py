"""The llava document kind end to end: LLaVA JSON records (a JSON array or JSONL) whose images
are files beside the JSON file, through the recipe, the map stage and the Loader
(datalane/engine/documents/llava.py, datalane/engine/formats/llavajson.py, docs/vlm.md).

The hand-worked record holds one 64 x 64 PNG: TorchTitan's rule grows it to the 65,536-pixel
minimum, 256 x 256 (a factor of 4), a grid of 256 / 16 = 16 patches a side, (1, 16, 16), and
16 * 16 / 2**2 = 64 placeholders. The 96 x 64 JPEG of the two-image record grows to 320 x 224
(14 x 20 patches): 70.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from datalane.engine.loader import Loader
from datalane.spec.errors import ConfigError, DataError, StorageError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import CHATML_TEMPLATE, LlavaCorpus, hostile_images, make_llava_corpus
from tests.support.kinds import VISION_TOKENIZER
from tests.support.vision import END, EOS, PAD, START, encoded

TOK = Tokenizer.from_file(str(VISION_TOKENIZER))


def _ids(text: str) -> list[int]:
    return list(TOK.encode(text, add_special_tokens=False).ids)


def _turns(*values: str) -> list[dict[str, str]]:
    return [{"from": "human" if k % 2 == 0 else "gpt", "value": v} for k, v in enumerate(values)]


def _write(folder: Path, records: list[Any], jsonl: bool = False, name: str = "") -> Path:
    path = folder / (name or ("data.jsonl" if jsonl else "data.json"))
    text = "".join(json.dumps(r) + "\n" for r in records) if jsonl else json.dumps(records)
    path.write_text(text)
    return path


def _recipe(uris: list[str], seq_len: int = 255, lanes: int = 1, batch: int = 1,
            **extra: Any) -> Any:
    llava = {"template_text": CHATML_TEMPLATE, **extra.pop("llava", {})}
    source = {"name": "llava", "uris": uris, "llava": llava, **extra.pop("source", {})}
    return load_recipe({
        "lanes": lanes, "global_batch_size": batch, "seq_len": seq_len,
        "tokenizer": {"uri": str(VISION_TOKENIZER)}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 1}, "sources": [source], **extra})


def _steps(recipe: Any) -> tuple[list[Any], Any]:
    out = []
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        while True:  # the step that ends may hold the last documents
            step = loader.next_step()
            out.append(step)
            if step.ended:
                return out, loader.counters()
            assert len(out) < 200


# -- the hand-worked record ------------------------------------------------------------------

def test_one_record_gives_the_hand_worked_ids_mask_and_attachment(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(encoded(64, 64, "PNG", 3))
    path = _write(tmp_path, [{"id": "1", "image": "img/a.png",
                              "conversations": _turns("<image>\nWhat is it?", "A dark sky.")}])
    # the template's text, cut at the marker; the assistant's content and end are trained
    p0 = "<|im_start|>user\n"
    p1_head = "\nWhat is it?<|im_end|>\n<|im_start|>assistant\n"
    p1_trained = "A dark sky.<|im_end|>\n"
    assert _ids(p1_head + p1_trained) == _ids(p1_head) + _ids(p1_trained)  # a clean boundary
    doc = [*_ids(p0), START, *[PAD] * 64, END, *_ids(p1_head), *_ids(p1_trained)]
    mask = [0] * (len(_ids(p0)) + 66 + len(_ids(p1_head))) + [1] * len(_ids(p1_trained))
    # what a tokenizer holding the vision tokens gives the text with the marker replaced
    replaced = p0 + "<|vision_start|>" + "<|image_pad|>" * 64 + "<|vision_end|>" + p1_head \
        + p1_trained
    assert TOK.encode(replaced, add_special_tokens=False).ids == doc
    steps, counters = _steps(_recipe([str(path)]))
    assert counters.kept == 1 and counters.skipped == {}
    n = len(doc)
    ids, got_mask = steps[0].columns["input_ids"][0], steps[0].columns["loss_mask"][0]
    assert ids.tolist() == [*doc, *[EOS] * (256 - n)]
    assert got_mask.tolist() == [*mask, *[0] * (256 - n)]
    # the image at its run's first placeholder: after the first piece and vision_start
    assert steps[0].columns["image_offset"].tolist() == [len(_ids(p0)) + 1]
    assert steps[0].columns["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert steps[0].columns["image_seq"].tolist() == [0]


def test_a_two_image_record_attaches_each_image_at_its_own_run(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(encoded(64, 64, "PNG", 3))
    (tmp_path / "b.jpg").write_bytes(encoded(96, 64, "JPEG", 1))
    path = _write(tmp_path, [{"image": ["a.png", "b.jpg"], "conversations": _turns(
        "<image> and <image>: alike?", "No.")}], jsonl=True)
    p0, p1 = "<|im_start|>user\n", " and "
    p2 = ": alike?<|im_end|>\n<|im_start|>assistant\nNo.<|im_end|>\n"
    doc = [*_ids(p0), START, *[PAD] * 64, END, *_ids(p1), START, *[PAD] * 70, END, *_ids(p2)]
    steps, counters = _steps(_recipe([str(path)]))
    assert counters.kept == 1
    ids = steps[0].columns["input_ids"][0].tolist()
    assert ids[:len(doc)] == doc
    first = len(_ids(p0)) + 1
    second = first + 64 + 1 + len(_ids(p1)) + 1
    assert steps[0].columns["image_offset"].tolist() == [first, second]
    assert steps[0].columns["image_grid_thw"].tolist() == [[1, 16, 16], [1, 14, 20]]
    assert steps[0].columns["image_patch_start"].tolist() == [0, 256, 256 + 280]  # 16*16, 14*20
    assert ids[first - 1] == START and ids[second - 1] == START


def test_a_record_without_an_image_is_a_plain_conversation(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"id": "t", "conversations": _turns("Hi?", "Hello.")}])
    steps, counters = _steps(_recipe([str(path)]))
    text = "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    assert counters.kept == 1
    assert steps[0].columns["input_ids"][0].tolist()[:len(_ids(text))] == _ids(text)
    assert len(steps[0].columns["image_offset"]) == 0


# -- refusals ----------------------------------------------------------------------------------

#: (record, reason, what the detail says); the folder holds ok.png, big.png, bad.jpg and
#: a symlink out.png to a file outside it
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"image": "/etc/passwd", "conversations": _turns("<image>", "a")}, "image_path",
     r"image '/etc/passwd': the path is absolute"),
    ({"image": "../x.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"image '\.\./x\.png': the path holds '\.\.'"),
    ({"image": "img/../../x.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"holds '\.\.'"),
    ({"image": "s3://bucket/x.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"the path is a URI"),
    ({"image": "file:ok.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"the path is a URI"),
    ({"image": "a\\..\\ok.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"a NUL byte or a backslash"),
    ({"image": "", "conversations": _turns("<image>", "a")}, "image_path",
     r"an empty string"),
    ({"image": ["ok.png", 7], "conversations": _turns("<image><image>", "a")}, "image_path",
     r"image\[1\] int: the path is int"),
    ({"image": "out.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"leads outside the JSON file's folder .* once symlinks are resolved"),
    ({"image": "nothere.png", "conversations": _turns("<image>", "a")}, "image_missing",
     r"image 'nothere\.png': no such file"),
    # paths the filesystem refuses the same way every time are bad records, not I/O errors
    ({"image": "ok.png/x.png", "conversations": _turns("<image>", "a")}, "image_missing",
     r"image 'ok\.png/x\.png': no such file .*a component of the path is a file"),
    ({"image": "a" * 300 + ".png", "conversations": _turns("<image>", "a")}, "image_path",
     r"too long for the filesystem"),
    ({"image": "loop1", "conversations": _turns("<image>", "a")}, "image_path",
     r"image 'loop1': the path goes round a loop of symlinks"),
    ({"image": "\ud800.png", "conversations": _turns("<image>", "a")}, "image_path",
     r"not valid Unicode \(it holds a lone surrogate\)"),
    ({"image": "sub", "conversations": _turns("<image>", "a")}, "image_missing",
     r"not a file"),
    ({"image": "big.png", "conversations": _turns("<image>", "a")}, "image_too_large",
     r"over limits\.max_bytes 16,384"),
    ({"image": "bad.jpg", "conversations": _turns("<image>", "a")}, "image_truncated",
     r"'bad\.jpg': "),
    ({"image": ["ok.png"] * 3, "conversations": _turns("<image>" * 3, "a")}, "too_many_images",
     r"3 images, more than max_images 2"),
    ({"image": {"path": "ok.png"}, "conversations": _turns("<image>", "a")},
     "malformed_sample", r"field 'image' holds dict, not a path or a list of paths"),
    ({"image": "ok.png", "conversations": _turns("no marker", "a")}, "malformed_sample",
     r"0 <image> markers for 1 images"),
    ({"conversations": _turns("<image> but no image", "a")}, "malformed_sample",
     r"1 <image> markers for 0 images"),
    ({"image": "ok.png"}, "missing_field", r"no field 'conversations'"),
    ({"image": "ok.png", "conversations": [{"from": "robot", "value": "<image>"}]}, "bad_role",
     r"conversations\[0\]\.from is 'robot'"),
    ({"image": "ok.png", "conversations": [{"from": "human", "value": 3}]}, "not_text",
     r"conversations\[0\]\.value is int"),
    ({"image": "ok.png", "conversations": _turns("<image>\ud800", "a")}, "invalid_unicode",
     r"conversations\[0\]\.value holds the lone surrogate U\+D800 at character 7"),
    ({"image": "ok.png", "conversations": [{"value": "<image>"}]}, "not_messages",
     r"conversations\[0\] is not a mapping with 'from' and 'value'"),
    ({"image": "ok.png", "conversations": _turns("<image><|vision_end|>", "a")},
     "vision_token_in_text", r"holds the vision token '<\|vision_end\|>'"),
    ({"image": "ok.png", "conversations": _turns("<image>")}, "no_assistant",
     r"no assistant turn to train on \(llava\.train_on 'assistant'\)"),
]


def _bad_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "ok.png").write_bytes(encoded(64, 64, "PNG", 3))
    (folder / "big.png").write_bytes(encoded(256, 256, "PNG", 4))
    assert os.path.getsize(folder / "big.png") > 16384 > os.path.getsize(folder / "ok.png")
    (folder / "bad.jpg").write_bytes(hostile_images()["truncated_jpeg"][0][:4000])
    (folder / "sub").mkdir()
    (tmp_path / "outside.png").write_bytes(encoded(64, 64, "PNG", 3))
    (folder / "out.png").symlink_to(tmp_path / "outside.png")
    (folder / "loop1").symlink_to(folder / "loop2")
    (folder / "loop2").symlink_to(folder / "loop1")
    return folder


def _bad_recipe(path: Path, **extra: Any) -> Any:
    return _recipe([str(path)], llava={"max_images": 2, "limits": {"max_bytes": 16384}}, **extra)


def test_bad_records_are_counted_by_reason_and_the_good_one_kept(tmp_path: Path) -> None:
    folder = _bad_folder(tmp_path)
    good = {"image": "ok.png", "conversations": _turns("<image>\nWhat?", "This.")}
    rows = [good, *(b for b, _, _ in BAD)]
    path = _write(folder, rows)
    _, counters = _steps(_bad_recipe(path))
    want = Counter(r for _, r, _ in BAD)
    assert counters.kept == 1 and counters.docs == len(rows)
    assert counters.skipped == dict(want)


@pytest.mark.parametrize(("record", "reason", "match"), BAD)
def test_under_fail_a_bad_record_is_named_with_the_file_and_byte(
        tmp_path: Path, record: dict[str, Any], reason: str, match: str) -> None:
    folder = _bad_folder(tmp_path)
    good = {"image": "ok.png", "conversations": _turns("<image>\nWhat?", "This.")}
    path = _write(folder, [good, record])
    at = len(json.dumps([good])) - 1 + 2  # after "[", the good record, ", "
    with pytest.raises(DataError, match=rf"source 'llava': .*{match}.* in {path} at byte {at} "), \
            Loader(_bad_recipe(path, bad_records="fail"), 0, 1) as loader:
        for _ in range(3):
            loader.next_step()


def test_markers_in_two_turns_count_together(tmp_path: Path) -> None:
    """Two markers in two turns for two images is a document (the second in an assistant
    turn: its run is untrained, the turn's text around it trained)."""
    (tmp_path / "ok.png").write_bytes(encoded(64, 64, "PNG", 3))
    path = _write(tmp_path, [{"image": ["ok.png", "ok.png"],
                              "conversations": _turns("<image>", "x <image> y")}])
    steps, counters = _steps(_recipe([str(path)]))
    assert counters.kept == 1
    ids, mask = steps[0].columns["input_ids"][0], steps[0].columns["loss_mask"][0]
    runs = np.flatnonzero(ids == START)
    assert len(runs) == 2 and mask[ids == PAD].sum() == 0 and mask[ids == START].sum() == 0
    assert mask[runs[1] - 1] == 1 and mask[runs[1] + 66] == 1  # " x " and " y" trained


@pytest.mark.parametrize(("change", "match"), [
    ({"uris": ["x.parquet"]}, r"sources\[0\]\.llava: .* the parquet format does not do; use "
                              r"jsonl files"),
    ({"llava": {"max_images": 0}}, r"sources\[0\]\.llava\.max_images 0 must be >= 1"),
    ({"llava": {"image_field": "c", "messages_field": "c"}},
     r"sources\[0\]\.llava\.messages_field and image_field both name the key 'c'"),
    ({"llava": {"image_marker": "<|image_pad|>"}},
     r"sources\[0\]\.llava\.image_marker '<\|image_pad\|>' is one of the vision tokens"),
    ({"llava": {"template": "a", "template_text": "b"}},
     r"sources\[0\]\.llava\.template and sources\[0\]\.llava\.template_text are both set"),
])
def test_bad_llava_settings_are_refused_naming_the_field(change: dict[str, Any],
                                                         match: str) -> None:
    source = {"name": "p", "uris": ["x.json"], **change}
    source["llava"] = change.get("llava", {})
    with pytest.raises(ConfigError, match=match):
        load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                     "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "bestfit"},
                     "sources": [source]})


def test_a_llava_source_needs_a_packer_that_keeps_documents_whole() -> None:
    with pytest.raises(ConfigError, match=r"sources\[0\]\.llava: its documents must never be "
                                          r"split"):
        load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                     "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "wrap"},
                     "sources": [{"name": "p", "uris": ["x.json"], "llava": {}}]})


@pytest.mark.parametrize(("text", "match"), [
    ('[{"conversations": []}', r"the file ends at byte 22 inside its JSON array"),
    ('[{"conversations": []}] x', r"bytes after the JSON array's closing bracket \(at byte 22\), "
                                  r"at byte 24"),
    ('[{"conversations": []}}', r"the JSON array is closed by '\}' at byte 22"),
    ('[{"conversations": []}]' + " " * (1 << 20) + "x",
     r"bytes after the JSON array's closing bracket \(at byte 22\), at byte 1048599"),
])
def test_a_file_that_is_no_complete_array_is_an_error_naming_it(tmp_path: Path, text: str,
                                                                 match: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(DataError, match=rf"{path}: {match}"), \
            Loader(_recipe([str(path)]), 0, 1) as loader:
        loader.next_step()


def test_array_elements_that_are_no_records_are_bad_records(tmp_path: Path) -> None:
    """Empty elements ("[1,,2]", a trailing comma) and elements that are not objects are
    malformed_json each, at their own byte; "[]" is no record."""
    (tmp_path / "ok.png").write_bytes(encoded(64, 64, "PNG", 3))
    good = json.dumps({"image": "ok.png", "conversations": _turns("<image>", "a")})
    path = tmp_path / "odd.json"
    path.write_text(f' [ {good} ,, 7, "s", [1, {{"a": "]"}}], {good} , ]\n')
    _, counters = _steps(_recipe([str(path)]))
    assert counters.kept == 2 and counters.skipped == {"malformed_json": 5}
    empty = tmp_path / "empty.json"
    empty.write_text("[ ]")
    _, counters = _steps(_recipe([str(empty)]))
    assert counters.docs == 0


# -- the generated corpus: every world, nothing lost, restore -----------------------------------

@pytest.fixture(scope="module")
def llava_corpus(tmp_path_factory: pytest.TempPathFactory) -> LlavaCorpus:
    return make_llava_corpus(str(tmp_path_factory.mktemp("llava")), records=24)


def _corpus_recipe(uri: str, lanes: int = 4, batch: int = 4, seq_len: int = 1023) -> Any:
    return _recipe([uri], seq_len=seq_len, lanes=lanes, batch=batch,
                   source={"chunk_bytes": 2048}, shuffle={"block_size": 4})


def _windows(uri: str, world: int) -> list[bytes]:
    recipe = _corpus_recipe(uri)
    loaders = [Loader(recipe, r, world, Knobs(workers=2)) for r in range(world)]
    out: list[bytes] = []
    try:
        while True:
            steps = [ld.next_step() for ld in loaders]
            out.append(b"".join(s.columns["input_ids"].tobytes() for s in steps)
                       + b"".join(s.columns["loss_mask"].tobytes() for s in steps))
            if all(s.ended for s in steps):
                break
            assert len(out) < 100
    finally:
        for ld in loaders:
            ld.close()
    return out


def test_the_corpus_gives_the_same_windows_in_worlds_1_2_4(llava_corpus: LlavaCorpus) -> None:
    one = _windows(llava_corpus.json, 1)
    assert len(one) > 2
    assert _windows(llava_corpus.json, 2) == one
    assert _windows(llava_corpus.json, 4) == one


def test_nothing_is_lost_documents_and_images_counted(llava_corpus: LlavaCorpus) -> None:
    """Every record is a document, every image one whole run of its own placeholder count,
    from the JSON array and from the JSONL alike."""
    from datalane.engine.images import ImageRule, process

    want = sorted(process(Path(llava_corpus.root, p).read_bytes(), ImageRule()).tokens
                  for r in llava_corpus.records
                  for p in ([r["image"]] if isinstance(r.get("image"), str)
                            else r.get("image", [])))  # type: ignore[union-attr]
    assert len(want) == llava_corpus.images
    for uri in (llava_corpus.json, llava_corpus.jsonl):
        steps, counters = _steps(_corpus_recipe(uri, lanes=1, batch=2))
        assert counters.docs == counters.kept == len(llava_corpus.records)
        assert counters.skipped == {}
        runs = []
        for step in steps:
            for seq in step.columns["input_ids"]:
                starts, ends = np.flatnonzero(seq == START), np.flatnonzero(seq == END)
                assert len(starts) == len(ends)
                runs += [int(e - s - 1) for s, e in zip(starts, ends, strict=True)]
                assert all((seq[s + 1:e] == PAD).all() for s, e in zip(starts, ends,
                                                                      strict=True))
            assert len(step.columns["image_offset"]) == sum(
                int((seq == START).sum()) for seq in step.columns["input_ids"])
        assert sorted(runs) == want


def test_a_restored_lane_continues_exactly(llava_corpus: LlavaCorpus) -> None:
    """Resumed after each step, the loader gives the steps the unbroken one gave: the
    bestfit carry-over's records are re-read by reference from the JSON array (their images
    again)."""
    recipe = _corpus_recipe(llava_corpus.json, lanes=1, batch=1, seq_len=511)
    with Loader(recipe) as loader:
        whole, states = [], []
        while True:
            states.append(loader.state_dict())
            step = loader.next_step()
            whole.append(step.columns["input_ids"].tobytes())
            if step.ended:
                break
    assert len(whole) >= 5
    for k in range(1, len(whole), 3):
        with Loader(recipe) as again:
            again.load_state_dict(states[k])
            got = [again.next_step().columns["input_ids"].tobytes()
                   for _ in range(len(whole) - k)]
        assert got == whole[k:], f"resumed at step {k}"


def test_a_json_file_on_s3_reads_its_images_beside_it(
        tmp_path: Path, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus and two bad records uploaded to S3 (moto) read as the local files do: the
    images are fetched beside the JSON object; a missing object is ``image_missing`` and a
    ``..`` path ``image_path`` there too."""
    import s3fs

    corpus = make_llava_corpus(str(tmp_path / "c"), records=8)
    records = [*corpus.records,
               {"image": "images/none.png", "conversations": _turns("<image>", "a")},
               {"image": "images/../llava.json", "conversations": _turns("<image>", "a")}]
    _write(Path(corpus.root), records, name="bad.json")
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    fs.put(corpus.root, f"{s3_bucket.name}/c", recursive=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_bucket.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # sources reach the endpoint through the env

    def run(root: str) -> tuple[list[bytes], Any]:
        steps, counters = _steps(_recipe([f"{root}/bad.json"], seq_len=1023, batch=2))
        return [s.columns["input_ids"].tobytes() for s in steps], counters

    local, counters = run(corpus.root)
    remote, remote_counters = run(f"{s3_bucket.uri}/c")
    assert remote == local and remote_counters == counters
    assert counters.kept == 8 and counters.skipped == {"image_missing": 1, "image_path": 1}


def test_an_image_over_max_bytes_is_refused_unread_and_too_many_before_any_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The size decides before a byte is read (the file is never opened); a record naming
    more than max_images images reads none of them."""
    from datalane.engine.formats import llavajson

    folder = _bad_folder(tmp_path)
    path = _write(folder, [{"conversations": _turns("no image", "a")},  # a document first
                           {"image": "big.png", "conversations": _turns("<image>", "a")},
                           {"image": ["ok.png"] * 3, "conversations": _turns("<image>" * 3,
                                                                             "a")}])
    opened: list[str] = []
    monkeypatch.setattr(llavajson, "open", lambda p, *a, **k: opened.append(p), raising=False)
    _, counters = _steps(_bad_recipe(path))
    assert counters.skipped == {"image_too_large": 1, "too_many_images": 1} and opened == []


@pytest.mark.parametrize("train_on", ["all", "last_assistant"])
def test_train_on_marks_text_tokens_never_vision_tokens(tmp_path: Path, train_on: str) -> None:
    (tmp_path / "a.png").write_bytes(encoded(64, 64, "PNG", 3))
    path = _write(tmp_path, [{"image": "a.png", "conversations": _turns(
        "<image>\nWhat?", "One.", "And?", "Two.")}])
    steps, _ = _steps(_recipe([str(path)], llava={"train_on": train_on}))
    ids, mask = steps[0].columns["input_ids"][0], steps[0].columns["loss_mask"][0]
    n = int(np.flatnonzero(ids != EOS)[-1]) + 1  # the document (the tokenizer adds no EOS)
    vision = np.isin(ids[:n], [START, PAD, END])
    assert vision.sum() == 66 and mask[:n][vision].sum() == 0
    last = _ids("Two.<|im_end|>\n")
    if train_on == "all":
        assert mask[:n][~vision].all()
    else:  # the last assistant turn only: its content and end
        assert mask[:n].tolist() == [0] * (n - len(last)) + [1] * len(last)


def test_a_read_failing_for_the_storage_is_a_transient_storage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only errors of the path itself are bad records; an I/O error (EIO here) may pass, so it
    # stays a StorageError the job retries, naming the image and the JSON file
    from datalane.engine.formats import llavajson

    folder = _bad_folder(tmp_path)

    def failing(*_: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(llavajson, "_read_local", failing)
    with pytest.raises(StorageError, match=r"cannot read the image 'ok\.png' of .*data\.json: "
                                           r".*Input/output error") as got:
        llavajson.Folder.of(str(folder / "data.json")).read("ok.png", 16384)
    assert got.value.transient


@pytest.mark.parametrize("rel", ["%2e%2e/%2e%2e/secret.jpg", "a%2Fb.png", "x.png?v=1",
                                 "x.png#frag"])
def test_off_a_local_filesystem_url_characters_in_a_path_are_refused(rel: str) -> None:
    # fsspec's http filesystem puts the path in a URL: '%2e%2e/' decodes to '../' (outside
    # the JSON file's folder), '?' and '#' cut the path. The same names are plain on disk.
    from datalane.engine.formats.llavajson import _relative

    assert _relative(rel, local=False) == (
        None, "the path holds '%', '?' or '#', which a URL would decode or cut; on a remote "
              "filesystem image paths are plain names")
    assert _relative(rel, local=True)[0] == [p for p in rel.split("/")]


def test_a_remote_folder_reads_plain_paths_and_refuses_escapes() -> None:
    import fsspec

    from datalane.engine.formats.llavajson import Folder

    fs = fsspec.filesystem("memory")
    fs.pipe({"/llava-remote/d/ok.png": b"png", "/llava-remote/secret.jpg": b"secret"})
    try:
        folder = Folder.of("memory://llava-remote/d/data.json")
        assert folder.real is None  # not local
        assert folder.read("ok.png", 100) == (b"png", "", "")
        data, reason, detail = folder.read("%2e%2e/secret.jpg", 100)
        assert (data, reason) == (None, "image_path") and "'%', '?' or '#'" in detail
    finally:
        fs.rm("/llava-remote", recursive=True)
