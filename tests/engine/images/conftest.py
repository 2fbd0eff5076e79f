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

from datalane.testing.images import ImageCorpus, make_image_corpus

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


def corpus_images(corpus: ImageCorpus) -> list[tuple[str, bytes]]:
    """(extension, encoded bytes) of every valid image of ``corpus``, in key order."""
    import pyarrow.parquet as pq

    return [(r["ext"], r["image"]) for r in pq.read_table(Path(corpus.parquet)).to_pylist()]
