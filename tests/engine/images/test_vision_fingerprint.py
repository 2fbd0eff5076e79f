"""A vision recipe's fingerprint covers the libraries that decide its pixel bytes (Pillow, whose
resampling is the resize, and the JPEG and WebP decoders: datalane.engine.images.libraries),
so that a resume on another Pillow is refused naming it; a text recipe's fingerprint document
is what it always was."""

from __future__ import annotations

from pathlib import Path

import PIL
import pytest
from PIL import features

from datalane.corpus import tokenizer_path
from datalane.engine.plan import Plan
from datalane.spec.errors import MismatchError
from datalane.spec.fingerprint import check_fingerprint, fingerprint_of
from datalane.spec.recipe import load_recipe
from tests.support.vision import encoded, vision_recipe, write_shard


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    write_shard(tmp_path / "pairs.tar", [[("jpg", encoded(96, 64, "JPEG", 1)), ("txt", b"a")]])
    return tmp_path / "pairs.tar"


def test_a_vision_plan_fingerprints_pillow_and_the_decoders(shard: Path) -> None:
    plan = Plan.build(vision_recipe([str(shard)], 150))
    assert plan.fingerprint_doc["documents"] == {"pairs": {
        "kind": "vision", "pillow": PIL.__version__,
        "libjpeg_turbo": features.version("libjpeg_turbo"),
        "libwebp": features.version("webp")}}
    assert plan.fingerprint == fingerprint_of(plan.fingerprint_doc)


def test_a_resume_on_another_pillow_is_refused_naming_it(shard: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    saved = Plan.build(vision_recipe([str(shard)], 150))
    was = PIL.__version__
    monkeypatch.setattr(PIL, "__version__", "9.0.0")
    now = Plan.build(vision_recipe([str(shard)], 150))
    assert now.fingerprint != saved.fingerprint
    with pytest.raises(MismatchError, match=rf"these fields differ:\n  documents\.pairs\.pillow: "
                                            rf"saved '{was}', now '9\.0\.0'$"):
        check_fingerprint(saved.fingerprint, saved.fingerprint_doc, now.fingerprint,
                          now.fingerprint_doc, "the checkpoint")


def test_a_text_recipes_fingerprint_document_is_unchanged(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden form: the recipe, the files and the tokenizer's hash, nothing else, whatever
    Pillow is installed."""
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 16,
                          "tokenizer": {"uri": tokenizer_path()},
                          "sources": [{"name": "web", "uris": [str(tmp_path / "a.jsonl")]}]})
    plan = Plan.build(recipe)
    f = plan.sources[0].files[0]
    want = {"recipe": recipe.to_dict(), "files": {"web": [[f.uri, f.size, f.ident]]},
            "tokenizer_sha256": plan.tokenizer.sha256}
    assert plan.fingerprint_doc == want
    monkeypatch.setattr(PIL, "__version__", "9.0.0")
    assert Plan.build(recipe).fingerprint == plan.fingerprint == fingerprint_of(want)
