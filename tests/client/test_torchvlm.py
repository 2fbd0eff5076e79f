"""datalane.client.torchvlm: a microbatch with images is TorchTitan's multimodal batch, bit for
bit (its MultiModalCollator and M-RoPE builder on the same samples), and a microbatch whose
images do not fit its tokens is refused naming the value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.engine.images import Patches, PatchRule, process
from datalane.spec.errors import ConfigError, DataError
from datalane.testing.images import make_image_corpus
from tests.support.vlm import (
    RULE,
    Doc,
    Picture,
    microbatch,
    picture,
    titan_collator,
    titan_rows,
    titan_sample,
    titan_tokenizer,
)

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")  # torchtitan.hf_datasets.multimodal imports it
pytest.importorskip("torchtitan")

from datalane.client.torchvlm import mrope_positions, to_vlm  # noqa: E402  (needs torch)

pytestmark = pytest.mark.slow  # TorchTitan's multimodal stack

PAD, VIDEO, START, END, EOS, TPAD = 1024, 1025, 1026, 1027, 1, 1028  # tests/data/vision ids
SPECIAL = {"image_id": PAD, "video_id": VIDEO, "vision_start_id": START,
           "vision_end_id": END, "pad_id": TPAD}


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """TorchTitan's tokenizer and three pictures of the generated corpus: a JPEG, a PNG and
    a WebP (keys 0, 3 and 4), processed by datalane."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("vlm")
    corpus = make_image_corpus(str(root / "corpus"), images=5, per_shard=5)
    rows = pq.read_table(Path(corpus.parquet)).to_pylist()
    assert [r["ext"] for r in rows] == ["jpg", "jpg", "jpg", "png", "webp"]
    pictures = {}
    for key in (0, 3, 4):
        pic = picture(rows[key]["image"])
        # the pixels of the PNG are the ones datalane's whole pipeline patches
        whole = process(rows[key]["image"], RULE, repeat_frames=False)
        assert np.array_equal(whole.values, pic.patches.values)
        assert whole.grid_thw == pic.patches.grid_thw
        pictures[rows[key]["ext"]] = pic
    return {"tok": titan_tokenizer(str(root / "tok")), "pictures": pictures}


def _caption_doc(tok: Any, pic: Picture, caption: str) -> Doc:
    """The vision kind's document: start, the run, end, the caption, EOS; trained on the
    caption and EOS only."""
    k = pic.patches.tokens
    text = tok.tokenizer.encode(caption).ids
    return Doc([START, *[PAD] * k, END, *text, EOS], [0] * (k + 2) + [1] * (len(text) + 1),
               [(1, pic.patches)])


def _interleaved_doc(tok: Any, parts: list[str | Picture]) -> Doc:
    """Text parts and pictures in turn (OBELICS), then EOS."""
    doc = Doc([], [])
    for part in parts:
        if isinstance(part, str):
            text = tok.tokenizer.encode(part).ids
            doc.ids += text
            doc.mask += [1] * len(text)
        else:
            doc.images.append((len(doc.ids) + 1, part.patches))
            doc.ids += [START, *[PAD] * part.patches.tokens, END]
            doc.mask += [0] * (part.patches.tokens + 2)
    doc.ids.append(EOS)
    doc.mask.append(1)
    return doc


def _assert_same_batch(ours: tuple[dict[str, Any], Any], titan: tuple[dict[str, Any], Any]
                       ) -> None:
    (inputs, labels), (t_inputs, t_labels) = ours, titan
    assert list(inputs) == list(t_inputs)
    for key, value in t_inputs.items():
        mine = inputs[key]
        if value is None or isinstance(value, dict):
            assert mine == value, key
            continue
        assert (mine.dtype, mine.shape) == (value.dtype, value.shape), key
        # bit for bit: the float32 values compared as their bytes
        as_bits = torch.int32 if value.dtype == torch.float32 else value.dtype
        assert torch.equal(mine.view(as_bits), value.view(as_bits)), key
    assert labels.dtype == t_labels.dtype
    assert torch.equal(labels, t_labels)


def test_a_microbatch_with_images_is_torchtitans_collated_batch(setting: dict[str, Any]) -> None:
    tok, pics = setting["tok"], setting["pictures"]
    assert {f"{n}_id": getattr(tok, f"{n}_id") for n in tok.TOKEN_FIELDS} == SPECIAL
    jpg, png, webp = pics["jpg"], pics["png"], pics["webp"]
    cap_a, cap_b = "a red square over the street", "two small circle beside the wall"
    parts: list[str | Picture] = ["the picture of", webp, " beside three shapes", jpg,
                                  " under the sky"]
    text_d, text_e = "bright light of the field", "dark corner with two stripe"
    # row 0: two images in two documents; row 1: a document of two images among text, then a
    # text document; row 2: text only; row 3: padding only; every row ends in padding
    rows = [[_caption_doc(tok, jpg, cap_a), _caption_doc(tok, png, cap_b)],
            [_interleaved_doc(tok, parts), _interleaved_doc(tok, [text_d])],
            [_interleaved_doc(tok, [text_e])],
            []]
    samples = [[titan_sample(tok, [None, cap_a], [jpg, None]),
                titan_sample(tok, [None, cap_b], [png, None])],
               [titan_sample(tok, [None if isinstance(p, Picture) else p for p in parts],
                             [p if isinstance(p, Picture) else None for p in parts]),
                titan_sample(tok, [text_d], [None])],
               [titan_sample(tok, [text_e], [None])]]
    # the hand-built documents are the tokens TorchTitan's processor gives the same pairs
    for docs, titans in zip(rows[:3], samples, strict=True):
        assert [d.ids for d in docs] == [s["input_ids"].tolist() for s in titans]
    seq_len = max(sum(len(d.ids) for d in docs) for docs in rows) + 5
    columns = microbatch(rows, seq_len, TPAD)
    assert columns["image_seq"].tolist() == [0, 0, 1, 1]
    assert columns["image_grid_thw"][:, 0].tolist() == [1, 1, 1, 1]

    ours = to_vlm(columns, SPECIAL, RULE.patches)
    titan = titan_collator(tok, len(rows), seq_len)(titan_rows(samples))
    _assert_same_batch(ours, titan)
    inputs, labels = ours
    # what the comparison covered: 4 images, padded patches, -100 on the vision tokens
    assert inputs["pixel_values"].shape[0] == 4
    assert inputs["pixel_values"].shape[2] == 1536
    assert (labels[:, :-1][inputs["input"][:, 1:] == PAD] == -100).all()
    assert (labels[3] == -100).all() and (inputs["input"][3] == TPAD).all()
    assert "mrope_positions" in inputs


def test_a_microbatch_without_images_is_torchtitans_text_batch(setting: dict[str, Any]) -> None:
    tok = setting["tok"]
    text = "three shapes of the field"
    doc = _interleaved_doc(tok, [text])
    seq_len = len(doc.ids) + 3
    titan = titan_collator(tok, 2, seq_len)(titan_rows([[titan_sample(tok, [text], [None])]]))
    columns = microbatch([[doc], []], seq_len, TPAD)
    _assert_same_batch(to_vlm(columns, SPECIAL), titan)  # empty per-image columns
    text_only = {k: columns[k] for k in ("input_ids", "positions", "loss_mask")}
    _assert_same_batch(to_vlm(text_only, SPECIAL), titan)  # a text recipe's columns
    assert titan[0]["pixel_values"] is None and "mrope_positions" not in titan[0]


def _blank(h: int, w: int) -> Patches:
    """An image of h x w patches (before merging), all black."""
    return Patches(np.zeros((h * w, 768), np.uint8), (1, h, w), (h // 2) * (w // 2))


def _titan_mrope(columns: dict[str, np.ndarray]) -> np.ndarray:
    from torchtitan.hf_datasets.multimodal.mm_collator import MultiModalCollator

    collator = MultiModalCollator(batch_size=1, seq_len=1, max_images_per_batch=128,
                                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                  tokenizer=None, build_mrope_positions=True)
    out = collator._build_mrope_positions(
        torch.from_numpy(columns["input_ids"][:, :-1].astype(np.int64)),
        torch.from_numpy(columns["image_grid_thw"].astype(np.int64)), None,
        torch.from_numpy(np.maximum(columns["positions"][:, :-1], 0).astype(np.int64)),
        image_token_id=PAD, video_token_id=VIDEO)
    result: np.ndarray = out.numpy()
    return result


def test_mrope_of_an_image_after_five_text_tokens_by_hand() -> None:
    # 4 text tokens and <|vision_start|>, an image of 2 x 3 merged tokens (4 x 6 patches),
    # <|vision_end|> and 2 text tokens, then 2 padding tokens (a document of their own)
    doc = Doc([10, 11, 12, 13, START, *[PAD] * 6, END, 20, 21], [1] * 14, [(5, _blank(4, 6))])
    columns = microbatch([[doc]], 16, TPAD)
    inputs, _ = to_vlm(columns, SPECIAL)
    expected = [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4),
                # the run: t = 0, h in 0..1, w in 0..2, each plus the 5 before it
                (5, 5, 5), (5, 5, 6), (5, 5, 7), (5, 6, 5), (5, 6, 6), (5, 6, 7),
                # the text after resumes at the largest index + 1: 5 + 2 + 1
                (8, 8, 8), (9, 9, 9), (10, 10, 10),
                (0, 0, 0), (1, 1, 1)]  # padding restarts at 0
    assert [tuple(v) for v in inputs["mrope_positions"][0].tolist()] == expected
    assert np.array_equal(inputs["mrope_positions"].numpy(), _titan_mrope(columns))


def test_mrope_of_an_image_that_starts_its_document_by_hand() -> None:
    # document 1: a 2 x 2 image first (no vision_start), end, one text token;
    # document 2: a text token, vision_start, a 2 x 2 image, end; then padding
    docs = [Doc([*[PAD] * 4, END, 30], [1] * 6, [(0, _blank(4, 4))]),
            Doc([40, START, *[PAD] * 4, END], [1] * 7, [(2, _blank(4, 4))])]
    columns = microbatch([docs, []], 15, TPAD)
    inputs, _ = to_vlm(columns, SPECIAL)
    expected = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (2, 2, 2), (3, 3, 3),
                (0, 0, 0), (1, 1, 1), (2, 2, 2), (2, 2, 3), (2, 3, 2), (2, 3, 3), (4, 4, 4),
                (0, 0, 0), (1, 1, 1)]
    got = inputs["mrope_positions"]
    assert [tuple(v) for v in got[0].tolist()] == expected
    assert got[1].tolist() == [[i, i, i] for i in range(15)]  # a padding row counts along
    assert np.array_equal(got.numpy(), _titan_mrope(columns))
    # the builder alone, without torch's tensors around it
    assert np.array_equal(mrope_positions(inputs["positions"].numpy(), _images(columns), 2),
                          got.numpy())


def _random_rows(rng: np.random.Generator, rows: int, seq_len: int) -> list[list[Doc]]:
    """Rows of random documents: text runs and images (with or without <|vision_start|>,
    always closed by <|vision_end|>, grids of 1-3 x 1-4 merged tokens) in any order."""
    out = []
    for _ in range(rows):
        docs, room = [], seq_len + 1
        while room > 0 and rng.random() < 0.8:
            doc = Doc([], [])
            for _ in range(int(rng.integers(1, 5))):
                if rng.random() < 0.5:
                    doc.ids += [int(t) for t in rng.integers(3, 900, int(rng.integers(1, 6)))]
                else:
                    h, w = 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 5))
                    start = [START] if rng.random() < 0.7 else []
                    doc.images.append((len(doc.ids) + len(start), _blank(h, w)))
                    doc.ids += [*start, *[PAD] * (h * w // 4), END]
            doc.mask = [1] * len(doc.ids)
            if len(doc.ids) > room:
                break
            docs.append(doc)
            room -= len(doc.ids)
        out.append(docs)
    return out


def test_mrope_equals_torchtitans_on_random_layouts() -> None:
    from torchtitan.models.common.multimodal import get_vision_positions

    rng = np.random.default_rng(21)
    images = 0
    for _ in range(40):
        columns = microbatch(_random_rows(rng, 3, 48), 48, TPAD)
        inputs, _ = to_vlm(columns, SPECIAL)
        if inputs["grid_thw"] is None:
            continue
        images += len(inputs["grid_thw"])
        assert np.array_equal(inputs["mrope_positions"].numpy(), _titan_mrope(columns))
        # the model finds each image's run where the columns put it
        found = get_vision_positions(inputs["input"], inputs["grid_thw"].prod(-1) // 4, PAD)
        assert found == [(i, int(s), int(o), int(n)) for i, (s, o, n) in enumerate(zip(
            columns["image_seq"], columns["image_offset"],
            inputs["grid_thw"].prod(-1) // 4, strict=True))]
    assert images > 100


def _images(columns: dict[str, np.ndarray]) -> Any:
    from datalane.client.torchvlm import check_images

    return check_images(columns, PatchRule(), PAD)


def _valid() -> dict[str, np.ndarray]:
    """Row 0: an image of 6 tokens (4 x 6 patches) at token 1, one of 4 (4 x 4) at token 11;
    row 1: text. 24 input tokens a row."""
    docs = [Doc([START, *[PAD] * 6, END, 7], [0] * 8 + [1], [(1, _blank(4, 6))]),
            Doc([START, *[PAD] * 4, END], [0] * 6, [(1, _blank(4, 4))])]
    return microbatch([docs, [Doc([5, 6, 7, 8], [1] * 4)]], 24, TPAD)


def _set(name: str, index: Any, value: Any) -> Callable[[dict[str, np.ndarray]], None]:
    def change(c: dict[str, np.ndarray]) -> None:
        c[name][index] = value
    return change


def _grid_of_8(c: dict[str, np.ndarray]) -> None:
    # image 0 says 4 x 8 patches (8 tokens) and carries its 32 patch rows; the run is 6
    c["image_grid_thw"][0] = (1, 4, 8)
    c["image_patches"] = np.zeros((32 + 16, 768), np.uint8)
    c["image_patch_start"] = np.array([0, 32, 48], np.int64)


def _swapped(c: dict[str, np.ndarray]) -> None:
    for name in ("image_grid_thw", "image_offset"):
        c[name] = c[name][::-1].copy()
    c["image_patch_start"] = np.array([0, 16, 40], np.int64)


def _run_into_the_last_token(c: dict[str, np.ndarray]) -> None:
    # a third image of 4 tokens at token 20 of row 1, whose run goes on into token 24: the
    # row's last token, a target only (its document would not have fitted the row)
    c["input_ids"][1, 20:25] = PAD
    c["image_seq"] = np.array([0, 0, 1], np.int32)
    c["image_offset"] = np.array([1, 10, 20], np.int32)
    c["image_grid_thw"] = np.array([(1, 4, 6), (1, 4, 4), (1, 4, 4)], np.int32)
    c["image_patches"] = np.zeros((56, 768), np.uint8)
    c["image_patch_start"] = np.array([0, 24, 40, 56], np.int64)


def _missing(c: dict[str, np.ndarray]) -> None:
    del c["image_seq"]


def _flat_grid(c: dict[str, np.ndarray]) -> None:
    c["image_grid_thw"] = c["image_grid_thw"].reshape(-1)


def _float_patches(c: dict[str, np.ndarray]) -> None:
    c["image_patches"] = c["image_patches"].astype(np.float32)


REFUSED = [
    (_set("image_seq", 1, 2), r"image_seq\[1\] = 2 is outside the microbatch's 2 rows"),
    (_set("image_seq", 0, -1), r"image_seq\[0\] = -1 is outside the microbatch's 2 rows"),
    (_set("image_offset", 0, 40), r"image_offset\[0\] = 40: image 0 \(image_seq 0, "
     r"image_offset 40\)'s 6 placeholder tokens do not lie inside the 24 input tokens"),
    (_set("image_offset", 1, 21), r"image_offset\[1\] = 21: .*'s 4 placeholder tokens do not"),
    (_set("image_offset", 0, 2), r"image 0 \(image_seq 0, image_offset 2\): its grid_thw "
     r"\(1, 4, 6\) makes 6 placeholder tokens but the row has a run of 6 \(token 1024\) from "
     r"token 1"),
    (_set("image_offset", 1, 9), r"image 1 \(image_seq 0, image_offset 9\): .* makes 4 "
     r"placeholder tokens but the row has a run of 0 \(token 1024\) from token 9"),
    (_grid_of_8, r"image 0 .*: its grid_thw \(1, 4, 8\) makes 8 placeholder tokens but the row "
     r"has a run of 6 \(token 1024\) from token 1"),
    (_run_into_the_last_token, r"image 2 \(image_seq 1, image_offset 20\): its grid_thw "
     r"\(1, 4, 4\) makes 4 placeholder tokens but the row has a run of 5 \(token 1024\) from "
     r"token 20"),
    (_set("input_ids", (1, 24), PAD), r"the microbatch holds 11 placeholder tokens \(token "
     r"1024\) but its 2 images account for 10"),
    (_set("image_patch_start", 1, 44), r"image_patch_start \[0, 44, 40\] is not monotone: it "
     r"decreases at index 2"),
    (_set("image_patch_start", 2, 36), r"image_patch_start runs from 0 to 36, not from 0 to "
     r"the 40 rows of image_patches"),
    (_set("image_patch_start", 1, 20), r"image_patch_start\[0:2\] = \[0, 20\] gives image 0 20 "
     r"patch rows but its grid_thw \(1, 4, 6\) has 24"),
    (_set("image_grid_thw", 0, (2, 4, 6)), r"image_grid_thw\[0\] = \(2, 4, 6\) is not a still "
     r"image's grid"),
    (_swapped, r"image 1 \(image_seq 0, image_offset 1\) comes after image 0 \(image_seq 0, "
     r"image_offset 10\)"),
    (_set("input_ids", (1, 3), PAD), r"the microbatch holds 11 placeholder tokens \(token "
     r"1024\) but its 2 images account for 10"),
    (_set("input_ids", (1, 3), VIDEO), r"input_ids\[1, 3\] is the video placeholder 1025"),
    (_set("positions", (0, 4), 0), r"image 0 .*: its placeholder run crosses a document "
     r"boundary"),
    (_missing, r"the microbatch has \['image_patches', 'image_grid_thw', 'image_offset', "
     r"'image_patch_start'\] but not \['image_seq'\]"),
    (_flat_grid,
     r"image_grid_thw: int32 of shape \(6,\) is not integers of shape \(N, 3\)"),
    (_float_patches, r"image_patches: float32 of shape \(40, 768\) is not uint8 \(P, 768\)"),
]


@pytest.mark.parametrize("change,message", REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_images_that_do_not_fit_the_tokens_are_refused_naming_the_value(
        change: Callable[[dict[str, np.ndarray]], None], message: str) -> None:
    columns = _valid()
    to_vlm(columns, SPECIAL)  # valid as built
    change(columns)
    with pytest.raises(DataError, match=message):
        to_vlm(columns, SPECIAL)


def test_special_tokens_and_patch_order_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"lacks \['pad_id'\]"):
        to_vlm(_valid(), {k: v for k, v in SPECIAL.items() if k != "pad_id"})
    with pytest.raises(ConfigError, match=r"images.order 'raster'"):
        to_vlm(_valid(), SPECIAL, PatchRule(order="raster"))
