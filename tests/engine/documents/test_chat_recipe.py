"""A chat recipe end to end through the engine: schema, masks through both packers, worlds.

The chat kind's own rendering and masks are checked against ``transformers`` in
``tests/engine/documents/test_chat.py``; here the recipe is the product's chat corpus
(:func:`datalane.corpus.make_chat_corpus`) and what is checked is what the engine does with
the columns: a third column in the schema and the hash, masks that travel with their tokens
through ``wrap`` and ``bestfit``, text documents of the same recipe trained on every token,
padding masked, and the stream independent of the world size and of resumes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from datalane.corpus import ChatCorpus, make_chat_corpus
from datalane.engine import Loader, Plan
from datalane.engine.formats import FORMATS
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Packing, Recipe, Shuffle, load_recipe
from datalane.testing.images import CHATML_TEMPLATE as CHATML
from tests.support import paths


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> ChatCorpus:
    return make_chat_corpus(str(tmp_path_factory.mktemp("chat")), conversations=240, lanes=4)


def _documents(plan: Plan, source: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every document of a source in file order, mapped by the source's kind directly."""
    sp = plan.sources[source]
    out = []
    for sf in sp.files:
        for line in Path(sf.uri).read_bytes().splitlines():
            value, reason, _ = FORMATS["jsonl"].decode(line, sp.source.field)
            assert reason is None
            doc, reason, _ = sp.kind.render(value)
            if doc is None:
                continue
            cols, offs, _ = sp.kind.tokenize([doc])
            mask = cols.get("loss_mask", np.ones(int(offs[-1]), np.uint8))
            out.append((cols["input_ids"], mask))
    return out


def test_the_schema_has_the_mask_and_the_hash_covers_it(chat: ChatCorpus) -> None:
    recipe = load_recipe(chat.recipe)
    plan = Plan.build(recipe)
    assert plan.schema.names == ("input_ids", "positions", "loss_mask")
    assert plan.schema.column("loss_mask").dtype == "uint8"
    with Loader(recipe, 0, 1, plan=plan) as ld:
        step = ld.next_step()
    mask = step.columns["loss_mask"]
    assert mask.shape == step.input_ids.shape and set(np.unique(mask)) <= {0, 1}
    assert 0 < mask.mean() < 1
    assert (mask[step.positions < 0] == 0).all(), "padding is never trained on"
    # the lane digest changes when only the mask changes
    from datalane.spec.hashing import window_digest
    cols = {k: v[:recipe.lane_batch] for k, v in step.columns.items()}
    flipped = dict(cols, loss_mask=1 - cols["loss_mask"])
    assert window_digest(plan.schema, cols) == step.lane_digests[0]
    assert window_digest(plan.schema, flipped) != step.lane_digests[0]


def _one_lane(recipe: Recipe, algorithm: str) -> Recipe:
    """The chat source's first file as one chunk of one lane, unshuffled: the lane reads the
    file's documents in file order."""
    first = sorted(Path(recipe.sources[0].uris[0]).parent.glob("*.jsonl"))[0]
    sources = [dataclasses.replace(recipe.sources[0], uris=[str(first)], chunk_bytes=1 << 30,
                                   epochs=1)]
    return dataclasses.replace(recipe, lanes=1, global_batch_size=2, sources=sources,
                               packing=Packing(algorithm=algorithm),
                               shuffle=Shuffle(block_size=1))


def test_wrap_carries_each_mask_with_its_tokens(chat: ChatCorpus) -> None:
    recipe = _one_lane(load_recipe(chat.recipe), "wrap")
    plan = Plan.build(recipe)
    docs = _documents(plan, 0)
    ids, mask = [], []
    with Loader(recipe, 0, 1, plan=plan) as ld:
        for step in ld:
            real = step.positions >= 0
            ids.append(step.input_ids[real])
            mask.append(step.columns["loss_mask"][real])
            if step.ended:
                break
    # one lane, one chunk, no shuffle: wrap's stream is the documents back to back
    assert np.array_equal(np.concatenate(ids), np.concatenate([d for d, _ in docs]))
    assert np.array_equal(np.concatenate(mask), np.concatenate([m for _, m in docs])), (
        "wrap must keep each token's loss mask with the token")


def test_bestfit_carries_each_mask_with_its_tokens(chat: ChatCorpus) -> None:
    recipe = _one_lane(load_recipe(chat.recipe), "bestfit")
    plan = Plan.build(recipe)
    docs = _documents(plan, 0)

    def masks_of(seg: np.ndarray) -> set[bytes]:
        """The loss masks of every place (token-aligned) where ``seg`` occurs in a document."""
        found, needle = set(), seg.tobytes()
        for d, m in docs:
            hay, at = d.tobytes(), -1
            while (at := hay.find(needle, at + 1)) >= 0:
                if at % 4 == 0:
                    found.add(m[at // 4:at // 4 + len(seg)].tobytes())
        return found

    segments = unambiguous = 0
    with Loader(recipe, 0, 1, plan=plan) as ld:
        for step in ld:
            for row in range(step.input_ids.shape[0]):
                pos = step.positions[row]
                starts = [i for i in range(len(pos)) if pos[i] == 0]
                if not starts:  # a padding row of the ended lane
                    continue
                for a, b in zip(starts, [*starts[1:], int((pos >= 0).sum())], strict=True):
                    seg = step.input_ids[row, a:b]
                    seg_mask = step.columns["loss_mask"][row, a:b]
                    found = masks_of(seg)
                    assert found, "a packed piece is not a slice of any document"
                    assert seg_mask.tobytes() in found, (
                        "bestfit must keep each token's loss mask with the token")
                    segments += 1
                    unambiguous += len(found) == 1
            if step.ended:
                break
    assert segments >= len(docs) and unambiguous >= 0.9 * segments


def test_text_documents_of_a_chat_recipe_are_trained_on_every_token(chat: ChatCorpus) -> None:
    recipe = load_recipe(chat.recipe)
    text_only = dataclasses.replace(recipe, sources=[dataclasses.replace(
        recipe.sources[1], weight=1.0)], lanes=1, global_batch_size=2)
    plan = Plan.build(text_only)
    assert plan.schema.names == ("input_ids", "positions"), "a text recipe has no mask"
    chat_plan = Plan.build(recipe)
    stage = chat_plan.map_stages()[1]  # the text source of the chat recipe
    line = json.dumps({"text": "plain words here"}).encode()
    res = stage.run([(0, 0, line)], [FORMATS["jsonl"]])
    assert res.status == [None]
    assert res.columns["loss_mask"].tolist() == [1] * len(res.tokens)


def test_a_chat_recipe_is_the_same_stream_on_every_world_and_after_resumes(
        chat: ChatCorpus) -> None:
    recipe = load_recipe(chat.recipe)
    plan = Plan.build(recipe)
    steps = 8
    base = run_world(recipe, 1, Knobs(workers=1), steps, plan=plan,
                     save_at=frozenset([3]))
    for world in (2, 4):
        assert run_world(recipe, world, Knobs(workers=3), steps, plan=plan).hashes == \
            base.hashes, f"world {world}"
    rest = run_world(recipe, 2, Knobs(workers=2), steps - 3, plan=plan,
                     start=base.checkpoints[3])
    assert {s: rest.hashes[s] for s in range(3, steps)} == \
        {s: base.hashes[s] for s in range(3, steps)}


def test_a_chat_source_of_a_recipe_changes_the_fingerprint_with_its_template(
        chat: ChatCorpus, tmp_path: Path) -> None:
    recipe = load_recipe(chat.recipe)
    a = Plan.build(recipe)
    other = dataclasses.replace(recipe.sources[0].chat, template_text=(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"))
    b = Plan.build(dataclasses.replace(recipe, sources=[
        dataclasses.replace(recipe.sources[0], chat=other), recipe.sources[1]]))
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint_doc["documents"]["sft"]["kind"] == "chat"


def test_a_lone_surrogate_is_a_bad_record_not_a_failed_map_task(tmp_path: Path) -> None:
    # JSON's "\ud800" decodes to a str the tokenizer refuses (TypeError for the whole batch,
    # failing the map task); the kind sets the record aside before tokenizing
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    bad = {"messages": [{"role": "user", "content": "hi\ud800"},
                        {"role": "assistant", "content": "yo"}]}
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, bad, good]))
    recipe = load_recipe({
        "lanes": 1, "global_batch_size": 1, "seq_len": 63,
        "tokenizer": {"uri": str(paths.DATA / "chat" / "tokenizer.json")},
        "sources": [{"name": "c", "uris": [str(path)], "chat": {"template_text": CHATML}}]})
    with Loader(recipe, 0, 1, Knobs(workers=1)) as loader:
        for _ in range(10):
            if loader.next_step().ended:
                break
        counters = loader.counters()
    assert (counters.kept, counters.skipped) == (2, {"invalid_unicode": 1}), counters
