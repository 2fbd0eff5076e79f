"""The recipe's image augmentation (``vision.augment``, ``interleaved.augment``:
datalane/spec/vision.py AugmentSpec): bounds, refusals naming the bad value, and a canonical
form that leaves it out while it is off (the fingerprint of a recipe without it is unchanged)."""

from __future__ import annotations

from typing import Any

import pytest

from datalane.spec.errors import ConfigError
from datalane.spec.recipe import load_recipe
from datalane.spec.vision import AugmentSpec


def _recipe(kind: str, augment: Any = None) -> Any:
    """A recipe of one ``kind`` source; ``augment`` None: left out."""
    settings = {} if augment is None else {"augment": augment}
    return load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                        "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "bestfit"},
                        "sources": [{"name": "p", "uris": ["x.parquet"], kind: settings}]})


@pytest.mark.parametrize("kind", ["vision", "interleaved"])
@pytest.mark.parametrize(("augment", "match"), [
    ({"crop": 0}, r"\.augment\.crop 0\.0 must be > 0$"),
    ({"crop": 1.5}, r"\.augment\.crop 1\.5 must be <= 1$"),
    ({"flip": -1}, r"\.augment\.flip -1\.0 must be >= 0$"),
    ({"flip": 1.01}, r"\.augment\.flip 1\.01 must be <= 1$"),
    ({"flip": "x"}, r"\.augment\.flip must be a number, got 'x'$"),
    ({"flip": True}, r"\.augment\.flip must be a number, got True$"),
    ({"crop": float("nan")}, r"\.augment\.crop must be a finite number, got nan$"),
    ({"rotate": 10}, r"\.augment\.rotate is not a known key; known keys: crop, flip$"),
    ({"flips": 0.5}, r"\.augment\.flips is not a known key; did you mean 'flip'\?$"),
    ("crop", r"\.augment must be a mapping, got str 'crop'$"),
])
def test_bad_augmentations_are_refused_naming_the_value(kind: str, augment: Any,
                                                        match: str) -> None:
    with pytest.raises(ConfigError, match=rf"^sources\[0\]\.{kind}{match}"):
        _recipe(kind, augment)


@pytest.mark.parametrize("kind", ["vision", "interleaved"])
def test_augmentation_is_in_the_canonical_recipe_only_when_it_changes_pixels(kind: str) -> None:
    plain = _recipe(kind)
    assert "augment" not in plain.to_dict()["sources"][0][kind]
    for off in ({}, {"crop": 1}, {"flip": 0}, {"crop": 1.0, "flip": 0.0}):
        assert _recipe(kind, off).to_dict() == plain.to_dict()
    on = _recipe(kind, {"crop": 0.8})
    assert on.to_dict()["sources"][0][kind]["augment"] == {"crop": 0.8, "flip": 0.0}
    assert getattr(on.sources[0], kind).augment == AugmentSpec(crop=0.8, flip=0.0)
    # the edges are allowed: the whole image (crop 1) and a flip of every image (flip 1)
    assert getattr(_recipe(kind, {"crop": 1e-3, "flip": 1}).sources[0], kind).augment == \
        AugmentSpec(crop=1e-3, flip=1.0)
