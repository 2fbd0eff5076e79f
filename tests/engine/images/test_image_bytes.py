"""The ``image_bytes`` knob bounds the decoded images a lane holds (docs/architecture.md,
Backpressure; docs/vlm.md, Bytes per image), and never changes a byte of the stream.

A hostile corpus for memory: every image resized to 1,088 x 1,120 pixels, 34 x 35 merged
patches: 1,190 placeholders (a document of 1,196 tokens with START, END, a 3-token caption and
EOS, nearly all of a sequence of 1,280) and 68 x 70 = 4,760 patch rows of 768 bytes, 3,655,680
bytes an image. The most a document of a sequence's 1,280 tokens can hold (``D``) is
1,280 x 2**2 x 768 = 3,932,160 bytes. The bound of a lane with one image source is
``max(image_bytes, D) + (bestfit_bins + 1) x D``: the map results not consumed and the tasks
in flight, then the packer's open sequences and the document it places.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from datalane.engine.images import Patches
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe
from tests.support.vision import encoded, vision_recipe, write_shard

IMAGES = 40
IMAGE = 68 * 70 * 768  # one image's patch rows, in bytes
D = 1280 * 4 * 768  # the most a document of a sequence's tokens holds
BINS = 2


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    """40 small PNGs, each resized to 1,088 x 1,120; blocks of 16 (old code mapped 16
    documents at once); 2 sequences a step, one image each."""
    path = tmp_path_factory.mktemp("big") / "big.tar"
    write_shard(path, [[("png", encoded(32, 32, "PNG", k)), ("txt", b"a big one")]
                       for k in range(IMAGES)])
    return vision_recipe([str(path)], 1279, global_batch_size=2,
                         shuffle={"block_size": 16},
                         packing={"algorithm": "bestfit", "bestfit_bins": BINS},
                         sources=[{"name": "big", "uris": [str(path)],
                                   "vision": {"resize": {"size": [1088, 1120]}}}])


def _held() -> int:
    """Bytes of the patch rows alive in the process (every image the engine decoded and
    still references, wherever it is; by exact type: isinstance would ask every object
    in the process, some of which warn when asked)."""
    return sum(o.values.nbytes for o in gc.get_objects() if type(o) is Patches)


def _run(recipe: Recipe, knobs: Knobs, measure: bool = False) -> tuple[list[Any], int]:
    """Every step's (global hash, patch bytes) until the lane ends, and the most image bytes
    alive at a step boundary."""
    gc.collect()
    assert _held() == 0
    out, peak = [], 0
    with Loader(recipe, 0, 1, knobs) as loader:
        for step in loader:
            if measure:
                peak = max(peak, _held())
            out.append((step.global_hash(), step.columns["image_patches"].tobytes()))
            if step.ended:
                break
    return out, peak


def test_the_most_a_document_holds_is_hand_computed(recipe) -> None:
    stage = Plan.build(recipe).map_stages()[0]
    assert stage.most_attached_bytes == D == 3_932_160
    stream, _ = _run(recipe, Knobs(workers=2), measure=False)
    # one image a sequence, two a step, each 4,760 rows of 768 bytes
    assert [len(p) for _, p in stream[:IMAGES // 2]] == [2 * IMAGE] * (IMAGES // 2)


@pytest.mark.parametrize("budget", [1, 2 * D + 1])
def test_images_held_at_step_boundaries_stay_under_the_bound(recipe, budget) -> None:
    _, peak = _run(recipe, Knobs(workers=2, image_bytes=budget), measure=True)
    bound = max(budget, D) + (BINS + 1) * D
    assert IMAGE < peak <= bound, (peak, bound)


def test_the_bound_changes_no_byte_of_the_stream(recipe) -> None:
    one_at_a_time, small = _run(recipe, Knobs(workers=2, image_bytes=1), measure=True)
    default, large = _run(recipe, Knobs(workers=2), measure=True)
    assert len(default) > IMAGES // 2  # every image, then a padded step
    assert one_at_a_time == default
    assert small < large  # the knob bites: the default holds a whole block's images


def test_a_bound_of_no_bytes_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"knobs\.image_bytes 0 must be >= 1"):
        Knobs(image_bytes=0)



def test_a_too_long_documents_images_are_let_go_before_its_task_ends(tmp_path,
                                                                     monkeypatch) -> None:
    """Four 1,200 x 1,200 JPEGs (resized to 1,216 x 1,216: 76 x 76 = 5,776 patch rows, 1,444
    placeholders, too long for a sequence of 1,280 tokens) and a 64 x 64 PNG (grown to
    256 x 256: 256 rows, 196,608 bytes) map in one task. When the task tokenizes, only the
    small image's rows are alive: the big ones were dropped as each was decoded, and they are
    still set aside as too long."""
    path = tmp_path / "mixed.tar"
    write_shard(path, [[("jpg", encoded(1200, 1200, "JPEG", k)), ("txt", b"too big")]
                       for k in range(4)] + [[("png", encoded(64, 64, "PNG", 9)),
                                              ("txt", b"fits")]])
    recipe = vision_recipe([str(path)], 1279, shuffle={"block_size": 8})
    plan = Plan.build(recipe)
    kind = plan.sources[0].kind
    alive: list[int] = []
    tokenize = kind.tokenize

    def measured(docs: Any) -> Any:
        alive.append(_held())
        return tokenize(docs)

    monkeypatch.setattr(kind, "tokenize", measured)
    gc.collect()
    with Loader(recipe, 0, 1, Knobs(workers=1), plan=plan) as loader:
        step = next(iter(loader))
        assert loader.counters().skipped == {"too_long": 4}
    assert alive == [256 * 768]
    assert step.columns["image_patches"].shape == (256, 768)
