"""Every document kind keeps the document-kind contract (datalane/engine/documents/base.py).

With the fixture tests/support/kinds.py registers for it, each kind - plain ``text`` and every
kind a ``Source`` field declares - built the way the plan builds it (``kind_for``): renders its
good values, tokenizes them to ``input_ids`` plus exactly the extra columns it declares, each
document's columns of one length; tokenizing a batch gives each document what tokenizing it
alone gives (a map task may hold any slice of records); a bad value is a bad record of a
reason the kind declares; a kind that tokenizes whole tasks of values at once
(``tokenizes_values``) gives what rendering them one by one gives, and None for a task with a
bad value. A declared kind without a fixture fails here by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from datalane.engine.documents import KINDS, kind_for
from datalane.engine.documents.base import KindBase
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import model
from datalane.spec.recipe import Source, TokenizerSpec, document_kinds
from datalane.spec.schema import text_schema
from tests.support.kinds import FIXTURES

NAMES = ["text", *document_kinds()]


def test_every_kind_has_a_fixture_and_an_implementation() -> None:
    missing = [n for n in NAMES if n not in FIXTURES]
    assert not missing, (f"document kinds without a fixture in tests/support/kinds.py "
                         f"FIXTURES: {missing}")
    assert list(KINDS) == list(document_kinds())


def _kind(name: str) -> Any:
    fixture = FIXTURES.get(name)
    if fixture is None:
        pytest.fail(f"document kind {name!r} has no fixture in tests/support/kinds.py")
    source = model.load(Source, {"name": "s", "uris": ["x.jsonl"], **fixture.source}, "s")
    handle = TokenizerHandle.load(TokenizerSpec(uri=fixture.tokenizer))
    kind = kind_for(source, handle, "sources[0]")
    assert isinstance(kind, KindBase), f"kind {name!r} is no KindBase"
    return kind, fixture


def _docs(tok: Any) -> list[dict[str, list[int]]]:
    columns, offsets, lengths = tok
    assert len(lengths) == len(offsets) - 1
    return [{c: a[offsets[i]:offsets[i + 1]].tolist() for c, a in columns.items()}
            for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("name", NAMES)
def test_good_values_render_and_tokenize_to_the_declared_columns(name: str) -> None:
    kind, fixture = _kind(name)
    rendered = []
    for value in fixture.good:
        doc, reason, detail = kind.render(value)
        assert doc is not None and reason is None, f"{name}: {value!r}: {reason} {detail}"
        rendered.append(doc)
    together = _docs(kind.tokenize(rendered))
    assert len(together) == len(fixture.good)
    for i, doc in enumerate(together):
        # per-token columns from the tokens; per-image ones from what the document attaches
        assert set(doc) == {"input_ids", *(c.name for c in kind.columns if not c.per_image)}
        assert kind.attaches == any(c.per_image for c in kind.columns), name
        assert len({len(v) for v in doc.values()}) == 1 and doc["input_ids"], (name, doc)
        alone = _docs(kind.tokenize([rendered[i]]))
        assert alone == [doc], f"{name}: document {i} tokenized alone differs"


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_value_is_a_bad_record_of_a_declared_reason(name: str) -> None:
    kind, fixture = _kind(name)
    doc, reason, detail = kind.render(fixture.bad)
    assert doc is None and reason in kind.bad_reasons and detail, (name, reason, detail)


@pytest.mark.parametrize("name", [n for n in NAMES if n in FIXTURES])
def test_whole_task_tokenizing_agrees_with_one_by_one(name: str) -> None:
    kind, fixture = _kind(name)
    if not kind.tokenizes_values:
        assert kind.tokenize_values(fixture.good) is None
        return
    rendered = [kind.render(v)[0] for v in fixture.good]
    whole = kind.tokenize_values(fixture.good)
    assert whole is not None
    assert _docs(whole) == _docs(kind.tokenize(rendered))
    np.testing.assert_array_equal(whole[2], kind.tokenize(rendered)[2])
    assert kind.tokenize_values([*fixture.good, fixture.bad]) is None


@pytest.mark.parametrize("name", NAMES)
def test_a_kind_with_images_states_a_vision_contract_that_fits_its_columns(name: str) -> None:
    """The schema carries it to the trainer, which cannot batch the images without it (the
    vision tokens' ids, the patch rule); a kind without per-image columns states none."""
    kind, fixture = _kind(name)
    if not any(c.per_image for c in kind.columns):
        assert kind.vision is None, name
        return
    assert kind.vision is not None, name
    text_schema(kind.vision.pad_id, kind.columns, kind.vision)  # (ValueError if it misfits)
    vocab = TokenizerHandle.load(TokenizerSpec(uri=fixture.tokenizer)).tokenizer
    assert (kind.vision.image_id, kind.vision.vision_start_id, kind.vision.vision_end_id) == \
        tuple(vocab.token_to_id(t) for t in ("<|image_pad|>", "<|vision_start|>",
                                             "<|vision_end|>")), name
