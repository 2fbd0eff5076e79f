"""TorchTitan's image functions, importable without torchvision, and a small image corpus.

torchtitan/hf_datasets/multimodal/utils/image.py imports torchvision at the top but its
resize rule (``smart_resize``, ``resize_to_pixel_budget``), ``vision_to_patches`` and
``calculate_vision_tokens`` use only torch and einops: where torchvision is not installed (the
shared venv) they are imported with an empty stand-in for it, removed again afterwards.
Tests that run TorchTitan's whole ``process_image`` (decode and resize with torchvision) skip
without it.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from datalane.testing.images import ImageCorpus, hostile_images, make_image_corpus
from tests.support.vision import encoded, write_shard

_TITAN_IMAGE = "torchtitan.hf_datasets.multimodal.utils.image"


@pytest.fixture(scope="session")
def titan_image() -> types.ModuleType:
    """torchtitan.hf_datasets.multimodal.utils.image (its pure functions at least)."""
    pytest.importorskip("torch")
    pytest.importorskip("einops")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        names = ["torchvision", "torchvision.io", "torchvision.transforms",
                 "torchvision.transforms.v2", "torchvision.transforms.v2.functional"]
        saved = {n: sys.modules.get(n) for n in names}
        sys.modules.update({n: types.ModuleType(n) for n in names})
        try:
            module = importlib.import_module(_TITAN_IMAGE)
        finally:
            for n, m in saved.items():
                if m is None:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = m
        sys.modules.pop(_TITAN_IMAGE, None)  # a later real import gets the real module
        return module
    return importlib.import_module(_TITAN_IMAGE)


@pytest.fixture(scope="session")
def image_corpus(tmp_path_factory: pytest.TempPathFactory) -> ImageCorpus:
    """20 synthetic images (JPEG, PNG, WebP; thumbnails to 1,500 px) in 2 shards + Parquet."""
    return make_image_corpus(str(tmp_path_factory.mktemp("images")), images=20, per_shard=10)


@pytest.fixture
def shard(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """The hand-worked shard (tests/support/vision.py): a 96 x 64 JPEG captioned "a red
    square" (81 tokens), a 512 x 256 PNG "two blue discs" (142 tokens, a ``json`` member
    beside it) and a truncated JPEG; and the three images' bytes."""
    images = [encoded(96, 64, "JPEG", 1), encoded(512, 256, "PNG", 2),
              hostile_images()["truncated_jpeg"][0]]
    write_shard(tmp_path / "pairs.tar", [
        [("jpg", images[0]), ("txt", b"a red square  \n")],
        [("json", b"{}"), ("png", images[1]), ("txt", b"two blue discs")],
        [("jpg", images[2]), ("txt", b"broken")],
    ])
    return tmp_path / "pairs.tar", images


def corpus_images(corpus: ImageCorpus) -> list[tuple[str, bytes]]:
    """(extension, encoded bytes) of every valid image of ``corpus``, in key order."""
    import pyarrow.parquet as pq

    return [(r["ext"], r["image"]) for r in pq.read_table(Path(corpus.parquet)).to_pylist()]
