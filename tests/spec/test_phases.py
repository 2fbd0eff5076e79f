"""Recipe phases: the weights formula, validation texts, the consumed prefix and amendments.

Expected values are computed by hand from the formula in docs/recipe.md (Schedules and
phases): at step ``start + k`` of a phase with ``ramp_steps`` R the weights are
``origin + (target - origin) * min(1, (k + 1) / R)``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from datalane.spec import load_recipe
from datalane.spec.errors import MismatchError
from datalane.spec.fingerprint import fingerprint_of
from datalane.spec.phases import (
    NAME_PATTERN,
    check_amend,
    phase_diff,
    phase_starts,
    prefix_document,
    used_sources,
    weights_at,
)
from tests.spec.test_recipe import error_of


def recipe(phases: list[dict[str, Any]] | None = None, weights: tuple[float, ...] = (1.0, 1.0),
           extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    names = ["web", "hq"]
    data: dict[str, Any] = {
        "lanes": 2, "global_batch_size": 4, "seq_len": 16,
        "tokenizer": {"uri": "/models/tokenizer.json"},
        "sources": [{"name": n, "uris": [f"/data/{n}/*.jsonl"], "weight": w}
                    for n, w in zip(names, weights, strict=True)] + (extra or []),
    }
    if phases is not None:
        data["phases"] = phases
    return data


ANNEAL = {"name": "anneal", "start_step": 10, "weights": {"web": 0.2, "hq": 0.8},
          "ramp_steps": 4}


# -- the formula --------------------------------------------------------------------------------

def test_without_phases_the_weights_are_the_sources_weights_at_every_step() -> None:
    r = load_recipe(recipe(weights=(0.7, 0.3)))
    assert [weights_at(r, s) for s in (0, 1, 10**9)] == [(0.7, 0.3)] * 3
    assert phase_starts(r) == []


def test_a_jump_changes_the_weights_exactly_at_its_start_step() -> None:
    r = load_recipe(recipe([{"name": "hq-only", "start_step": 5, "weights": {"web": 0}}]))
    assert weights_at(r, 4) == (1.0, 1.0)
    assert weights_at(r, 5) == (0.0, 1.0)
    assert weights_at(r, 6) == (0.0, 1.0)


def test_a_ramp_moves_linearly_and_ends_exactly_on_the_target() -> None:
    r = load_recipe(recipe([ANNEAL], weights=(1.0, 0.0)))
    assert weights_at(r, 9) == (1.0, 0.0)  # step start - 1: the origin
    # k = 0..3: fraction (k + 1) / 4; web 1 -> 0.2 (delta -0.8), hq 0 -> 0.8
    for k, f in enumerate((0.25, 0.5, 0.75)):
        web, hq = weights_at(r, 10 + k)
        assert web == pytest.approx(1.0 - 0.8 * f, abs=1e-15)
        assert hq == pytest.approx(0.8 * f, abs=1e-15)
    assert weights_at(r, 13) == (0.2, 0.8)  # exactly the target, not 1 + (0.2 - 1) * 1
    assert weights_at(r, 10**6) == (0.2, 0.8)
    assert phase_starts(r) == [("anneal", 10)]


def test_sources_a_phase_does_not_name_keep_the_previous_phases_weights() -> None:
    r = load_recipe(recipe([{"name": "a", "start_step": 3, "weights": {"web": 2.0}},
                            {"name": "b", "start_step": 6, "weights": {"hq": 5.0}}]))
    assert weights_at(r, 3) == (2.0, 1.0)
    assert weights_at(r, 6) == (2.0, 5.0)
    assert phase_starts(r) == [("a", 3), ("b", 6)]


def test_a_phase_that_cuts_a_ramp_short_starts_from_the_weights_in_force() -> None:
    # "a" ramps web 1 -> 3 over 4 steps from step 2; "b" starts at step 4 (a's k = 1 was the
    # last: web 1 + 2 * 2/4 = 2.0) and jumps hq to 0; web keeps heading to a's target 3
    r = load_recipe(recipe([{"name": "a", "start_step": 2, "weights": {"web": 3.0},
                             "ramp_steps": 4},
                            {"name": "b", "start_step": 4, "weights": {"hq": 0.0},
                             "ramp_steps": 2}]))
    assert weights_at(r, 3) == (2.0, 1.0)
    assert weights_at(r, 4) == (2.5, 0.5)  # half way from (2, 1) to (3, 0)
    assert weights_at(r, 5) == (3.0, 0.0)


def test_the_weights_up_to_a_step_depend_only_on_the_phases_started_by_then() -> None:
    base = [ANNEAL]
    later = [ANNEAL, {"name": "late", "start_step": 20, "weights": {"web": 9.0},
                      "ramp_steps": 50}]
    a, b = load_recipe(recipe(base)), load_recipe(recipe(later))
    assert [weights_at(a, s) for s in range(20)] == [weights_at(b, s) for s in range(20)]
    assert weights_at(a, 20) != weights_at(b, 20)


def test_used_sources_counts_the_steps_a_state_has_consumed() -> None:
    r = load_recipe(recipe([ANNEAL], weights=(1.0, 0.0)))
    assert used_sources(r, 0) == [True, False]  # the step-0 weights always count
    assert used_sources(r, 10) == [True, False]  # steps 0..9 consumed: hq not yet
    assert used_sources(r, 11) == [True, True]


def test_a_source_a_phase_leaves_at_weight_0_stays_unused() -> None:
    r = load_recipe(recipe([{"name": "web-half", "start_step": 3, "weights": {"web": 0.5}}],
                           weights=(1.0, 0.0)))
    assert used_sources(r, 100) == [True, False]  # hq's weight is 0 at every step


# -- validation ---------------------------------------------------------------------------------

def test_phase_names_follow_the_source_name_pattern() -> None:
    from datalane.spec import recipe as recipe_module

    assert NAME_PATTERN == recipe_module._NAME
    assert "does not match the pattern" in error_of(recipe([{**ANNEAL, "name": "Anneal"}]))


def test_an_unknown_source_in_a_phase_is_named_with_the_sources() -> None:
    assert error_of(recipe([{**ANNEAL, "weights": {"books": 1.0}}])) == (
        "phases[0].weights names 'books', which is not a source; the sources are web, hq")


def test_start_steps_must_increase_and_the_error_names_both_phases() -> None:
    text = error_of(recipe([ANNEAL, {"name": "cool", "start_step": 10, "weights": {}}]))
    assert text == ("phases[1] 'cool' starts at step 10, not after phases[0] 'anneal' at step "
                    "10; start steps must increase")


def test_phase_names_are_unique() -> None:
    text = error_of(recipe([ANNEAL, {**ANNEAL, "start_step": 20}]))
    assert text == "phases[1].name 'anneal' is used by phases[0]; phase names must be unique"


def test_bounds_of_start_ramp_and_weights() -> None:
    assert error_of(recipe([{**ANNEAL, "start_step": 0}])) == "phases[0].start_step 0 must be >= 1"
    assert error_of(recipe([{**ANNEAL, "ramp_steps": 0}])) == "phases[0].ramp_steps 0 must be >= 1"
    assert error_of(recipe([{**ANNEAL, "weights": {"hq": -1}}])) == (
        "phases[0].weights.hq -1.0 must be >= 0")
    assert error_of(recipe([{**ANNEAL, "weights": {"hq": "x"}}])) == (
        "phases[0].weights.hq must be a number, got 'x'")
    assert "sources[0].weight -1.0 must be >= 0" in error_of(recipe(weights=(-1.0, 1.0)))


def test_the_weights_must_have_a_positive_sum_at_step_0_and_in_every_phase() -> None:
    assert error_of(recipe(weights=(0.0, 0.0))) == (
        "sources: every source has weight 0 at step 0 (web 0, hq 0); at least one needs a "
        "positive weight")
    assert error_of(recipe([{**ANNEAL, "weights": {"web": 0, "hq": 0}}])) == (
        "phases[0] 'anneal' leaves every source at weight 0 (web 0, hq 0); at least one needs "
        "a positive weight")
    load_recipe(recipe(weights=(0.0, 1.0)))  # one source at 0 is fine


def test_recipes_without_phases_keep_their_canonical_form() -> None:
    r = load_recipe(recipe())
    assert "phases" not in r.to_dict()
    assert load_recipe(recipe([ANNEAL])).to_dict()["phases"] == [ANNEAL]


# -- the consumed prefix ------------------------------------------------------------------------

def document(data: dict[str, Any]) -> dict[str, Any]:
    r = load_recipe(data)
    return {"recipe": r.to_dict(),
            "files": {s.name: [[f"/data/{s.name}/0.jsonl", 10, "m"]] for s in r.sources},
            "tokenizer_sha256": "ab"}


def test_the_prefix_of_a_recipe_without_phases_is_its_document() -> None:
    doc = document(recipe())
    for step in (0, 1, 1000):
        assert prefix_document(doc, step) == doc


def test_the_prefix_drops_later_phases_unused_sources_and_eval() -> None:
    doc = document(recipe([ANNEAL], weights=(1.0, 0.0)))
    doc["recipe"]["eval"] = [{"name": "held-out"}]
    at10 = prefix_document(doc, 10)
    assert "phases" not in at10["recipe"] and "eval" not in at10["recipe"]
    assert [s["name"] for s in at10["recipe"]["sources"]] == ["web"]
    assert list(at10["files"]) == ["web"]
    assert "source_index" not in at10  # the kept sources are sources[0..]: no index needed
    hq_first = document(recipe([{**ANNEAL, "weights": {"web": 0.8, "hq": 0.2}}],
                               weights=(0.0, 1.0)))
    assert prefix_document(hq_first, 10)["source_index"] == {"hq": 1}
    at11 = prefix_document(doc, 11)
    assert at11["recipe"]["phases"] == [ANNEAL]
    assert "source_index" not in at11 and list(at11["files"]) == ["web", "hq"]
    assert doc["recipe"]["phases"] == [ANNEAL]  # the argument is not modified


def test_appending_a_phase_after_the_step_keeps_the_prefix_fingerprint() -> None:
    saved = document(recipe())
    amended = document(recipe([ANNEAL]))
    assert fingerprint_of(saved) != fingerprint_of(amended)
    assert fingerprint_of(prefix_document(saved, 10)) == fingerprint_of(
        prefix_document(amended, 10))
    assert fingerprint_of(prefix_document(saved, 11)) != fingerprint_of(
        prefix_document(amended, 11))


def test_the_diff_names_the_phase_its_start_and_the_field() -> None:
    old = document(recipe([ANNEAL]))
    new = copy.deepcopy(old)
    new["recipe"]["phases"][0]["weights"]["hq"] = 0.9
    lines = phase_diff(prefix_document(old, 1000), prefix_document(new, 1000), 1000)
    assert lines == ["  phases[0] 'anneal' (starts at step 10, before the resume step 1000): "
                     "weights.hq saved 0.8, now 0.9"]


# -- check_amend --------------------------------------------------------------------------------

def amend_error(old: dict[str, Any], new: dict[str, Any], step: int) -> str:
    with pytest.raises(MismatchError) as info:
        check_amend(load_recipe(old), load_recipe(new), step)
    return str(info.value)


def test_phases_starting_at_or_after_the_step_may_be_appended_changed_or_removed() -> None:
    late = {"name": "late", "start_step": 50, "weights": {"web": 3.0}}
    check_amend(load_recipe(recipe([ANNEAL])), load_recipe(recipe([ANNEAL, late])), 50)
    check_amend(load_recipe(recipe([ANNEAL, late])), load_recipe(recipe([ANNEAL])), 20)
    check_amend(load_recipe(recipe([ANNEAL, late])),
                load_recipe(recipe([ANNEAL, {**late, "start_step": 70}])), 11)
    check_amend(load_recipe(recipe()), load_recipe(recipe([ANNEAL])), 10)
    check_amend(load_recipe(recipe()), load_recipe(recipe([ANNEAL])), 0)


def test_editing_the_consumed_part_is_refused_naming_each_change() -> None:
    edited = {**ANNEAL, "weights": {"web": 0.2, "hq": 0.9}, "ramp_steps": 8}
    text = amend_error(recipe([ANNEAL]), recipe([edited]), 1000)
    assert text.splitlines() == [
        "the recipe cannot continue a run at step 1000: the part already consumed differs "
        "(phases starting at or after step 1000 may change freely):",
        "  phases[0] 'anneal' (starts at step 10, before the resume step 1000): ramp_steps "
        "saved 4, now 8",
        "  phases[0] 'anneal' (starts at step 10, before the resume step 1000): weights.hq "
        "saved 0.8, now 0.9",
    ]


def test_a_phase_added_or_removed_in_the_past_is_named() -> None:
    assert amend_error(recipe(), recipe([ANNEAL]), 11).splitlines()[1:] == [
        "  phases[0] 'anneal' (starts at step 10, before the resume step 11): added"]
    assert amend_error(recipe([ANNEAL]), recipe(), 11).splitlines()[1:] == [
        "  phases[0] 'anneal' (starts at step 10, before the resume step 11): removed"]


def test_a_source_weight_change_is_named_with_the_source() -> None:
    text = amend_error(recipe(), recipe(weights=(1.0, 2.0)), 5)
    assert text.splitlines()[1:] == ["  recipe.sources[1] 'hq'.weight: saved 1.0, now 2.0"]


def test_a_new_source_unused_until_the_step_may_be_added_after_the_others() -> None:
    books = {"name": "books", "uris": ["/data/books/*.jsonl"], "weight": 0}
    bring = {"name": "books-in", "start_step": 30, "weights": {"books": 1.0}}
    check_amend(load_recipe(recipe()), load_recipe(recipe([bring], extra=[books])), 30)
    # used before the step: refused
    text = amend_error(recipe(), recipe([{**bring, "start_step": 20}], extra=[books]), 30)
    assert "phases[0] 'books-in' (starts at step 20, before the resume step 30): added" in text
    assert re.search(r"recipe\.sources\[2\]\.name: saved '<absent>', now 'books'", text)


def test_a_new_source_before_the_existing_ones_is_refused() -> None:
    old = recipe()
    new = recipe()
    new["sources"].insert(0, {"name": "books", "uris": ["/b/*.jsonl"], "weight": 0})
    text = amend_error(old, new, 30)
    assert "  sources 'web': at sources[0] before, now sources[1]" in text
    assert "  sources 'hq': at sources[1] before, now sources[2]" in text


def test_removing_a_source_is_refused_even_when_unused() -> None:
    old = recipe([{"name": "in", "start_step": 100, "weights": {"hq": 1.0}}],
                 weights=(1.0, 0.0))
    new = recipe(weights=(1.0, 0.0))
    new["sources"].pop()
    text = amend_error(old, new, 30)
    assert "sources: 2 before, now 1; a source may be added after the others, never " \
        "removed" in text


def test_eval_streams_never_matter() -> None:
    old = load_recipe(recipe())
    doc = {"recipe": {**old.to_dict(), "eval": [{"name": "x"}]}}
    assert prefix_document(doc, 5) == {"recipe": old.to_dict()}


def test_mean_weights_average_each_steps_shares() -> None:
    from datalane.spec.phases import mean_weights

    r = load_recipe(recipe([{"name": "hq-only", "start_step": 2, "weights": {"web": 0}}]))
    # steps 0, 1: shares (0.5, 0.5); steps 2, 3: (0, 1)
    assert mean_weights(r, 4) == (0.25, 0.75)
    assert mean_weights(load_recipe(recipe(weights=(0.7, 0.3))), 4) == (0.7, 0.3)


def test_mean_weights_of_one_step_are_its_shares_and_of_none_the_step_0_weights() -> None:
    from datalane.spec.phases import mean_weights

    r = load_recipe(recipe([{"name": "hq-only", "start_step": 2, "weights": {"web": 0}}],
                           weights=(1.0, 3.0)))
    assert mean_weights(r, 1) == (0.25, 0.75)  # step 0 alone: 1/4, 3/4
    assert mean_weights(r, 0) == (1.0, 3.0)  # no step: the weights as written
    assert mean_weights(r, -1) == (1.0, 3.0)


def test_mean_weights_without_phases_are_the_weights_as_written() -> None:
    from datalane.spec.phases import mean_weights

    # not normalized: (2, 6) stays (2, 6), not the shares (0.25, 0.75)
    assert mean_weights(load_recipe(recipe(weights=(2.0, 6.0))), 4) == (2.0, 6.0)


# -- the prefix, the diff and amendments: edges -------------------------------------------------

def test_a_document_without_a_recipe_object_is_its_own_prefix_less_eval() -> None:
    assert prefix_document({"eval": [{"name": "x"}], "files": {}}, 5) == {"files": {}}
    assert prefix_document({"recipe": "r", "eval": 1}, 5) == {"recipe": "r"}


def test_the_prefix_drops_an_unused_sources_files_documents_and_chunks() -> None:
    # hq has weight 0 at step 0 and in "web-up" (steps 2..9); ANNEAL starts at the step: at
    # step 10 hq is unused, dropped with its entries; a table left empty goes, but "files"
    # stays (a document always has its files)
    doc = document(recipe([{"name": "web-up", "start_step": 2, "weights": {"web": 2.0, "hq": 0}},
                           ANNEAL], weights=(1.0, 0.0)))
    doc["documents"] = {"hq": "hq-docs"}
    doc["compressed_chunks"] = {"web": [[0, 7]], "hq": [[0, 9]]}
    out = prefix_document(doc, 10)
    assert out["recipe"]["phases"] == [{"name": "web-up", "start_step": 2,
                                        "weights": {"web": 2.0}, "ramp_steps": 1}]
    assert [s["name"] for s in out["recipe"]["sources"]] == ["web"]
    assert out["files"] == {"web": [["/data/web/0.jsonl", 10, "m"]]}
    assert "documents" not in out
    assert out["compressed_chunks"] == {"web": [[0, 7]]}
    doc["files"] = {"hq": [["/data/hq/0.jsonl", 10, "m"]]}
    assert prefix_document(doc, 10)["files"] == {}


LATE = {"name": "late", "start_step": 3, "weights": {}}


def test_the_diff_names_a_phase_field_or_weight_absent_on_one_side() -> None:
    saved = {"recipe": {"phases": [LATE]}}
    current = {"recipe": {"phases": [{**LATE, "ramp_steps": 2, "weights": {"hq": 0.5}}]}}
    assert phase_diff(saved, current, 5) == [
        "  phases[0] 'late' (starts at step 3, before the resume step 5): ramp_steps saved "
        "'<absent>', now 2",
        "  phases[0] 'late' (starts at step 3, before the resume step 5): weights.hq saved "
        "'<absent>', now 0.5"]
    assert phase_diff({"recipe": "a"}, {"recipe": "b"}, 5) == ["  recipe: saved 'a', now 'b'"]


def test_the_diff_shows_limit_lines_and_counts_every_other_one() -> None:
    # one phase line and 20 field lines: 12 shown (the phase's and 11 fields), 9 more
    saved = {"recipe": {"phases": [LATE]}, "x": {f"k{i:02}": 0 for i in range(20)}}
    current = {"recipe": {}, "x": {f"k{i:02}": 1 for i in range(20)}}
    lines = phase_diff(saved, current, 5)
    assert lines == [
        "  phases[0] 'late' (starts at step 3, before the resume step 5): removed",
        *(f"  x.k{i:02}: saved 0, now 1" for i in range(11)),
        "  ... and 9 more"]
    assert len(phase_diff(saved, current, 5, limit=21)) == 21  # all of them, no count
    assert phase_diff(saved, current, 5, limit=20)[-1] == "  ... and 1 more"


def test_a_source_is_named_only_where_both_sides_agree_on_its_name() -> None:
    old, new = recipe(), recipe()
    new["sources"][1]["name"] = "hq2"
    assert amend_error(old, new, 5).splitlines()[1:] == [
        "  recipe.sources[1].name: saved 'hq', now 'hq2'"]
    gone = recipe()
    gone["sources"].pop()
    assert amend_error(old, gone, 5).splitlines()[1:] == [
        *(f"  recipe.sources[1] 'hq'.{field}: saved {value}, now '<absent>'" for field, value in (
            ("chunk_bytes", "1048576"), ("chunk_rows", "None"), ("epochs", "1"),
            ("filters", "None"), ("format", "None"), ("name", "'hq'"),
            ("text_field", "'text'"), ("uris", "['/data/hq/*.jsonl']"), ("weight", "1.0"))),
        "  sources: 2 before, now 1; a source may be added after the others, never removed"]


def test_a_negative_step_is_refused() -> None:
    from datalane.spec.errors import ConfigError

    r = load_recipe(recipe())
    check_amend(r, r, 0)
    with pytest.raises(ConfigError) as info:
        check_amend(r, r, -1)
    assert str(info.value) == "step must be >= 0, got -1"


def test_every_table_of_a_document_whose_sources_are_all_used_is_kept() -> None:
    """Nothing is dropped, so nothing is rewritten: even an empty table stays (the prefix is
    the document itself, the fingerprint of a state saved before phases existed)."""
    doc = {**document(recipe([ANNEAL])), "documents": {}, "compressed_chunks": {}}
    assert prefix_document(doc, 11) == doc
