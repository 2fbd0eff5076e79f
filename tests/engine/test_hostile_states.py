"""Hostile resume states: unsealed states are refused unless allowed, and a sealed
state that the lane could never have written is refused naming the field and the value.

The states are real: saved by a loader over the test corpus, edited as an attacker (or a
faulty writer) would, and sealed again with datalane's own sealing, so the seal checks pass and
only the checks against the plan stand between the state and the stream.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from datalane.engine.loader import Loader
from datalane.spec.errors import DatalaneError, MismatchError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.spec.state import Checkpoint, checkpoint_sha256
from tests.support import paths

REPO = paths.REPO


def _state_after(r: Recipe, steps: int) -> dict[str, Any]:
    with Loader(r, 0, 1, Knobs(workers=1)) as loader:
        for _ in range(steps):
            loader.next_step()
        state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    return state


def _resealed(state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(state)
    edit(out)
    out["sha256"] = checkpoint_sha256(out)
    return out


def _restore_error(r: Recipe, state: dict[str, Any]) -> str:
    with Loader(r, 0, 1, Knobs(workers=1)) as loader, pytest.raises(MismatchError) as info:
        loader.load_state_dict(state)
        loader.next_step()  # the lanes open, and check their states, at the first step
    return str(info.value)


@pytest.fixture(scope="module")
def saved(corpus: Any) -> tuple[Recipe, dict[str, Any]]:
    from tests.conftest import base_recipe_dict

    r = load_recipe(base_recipe_dict(corpus))
    return r, _state_after(r, 3)


# -- unsealed states --------------------------------------------------------------------------


def test_an_unsealed_state_is_refused_unless_allowed(saved: tuple[Recipe, dict[str, Any]],
                                                     ) -> None:
    r, state = saved
    unsealed = {k: v for k, v in state.items() if k != "sha256"}
    with Loader(r, 0, 1, Knobs(workers=1)) as loader:
        with pytest.raises(MismatchError) as info:
            loader.load_state_dict(unsealed)
        assert str(info.value) == (
            "checkpoint carries no sha256 of its content, so damage to it cannot be detected; "
            "datalane has sealed every state it wrote since 0.2. A state of datalane 0.1 loads "
            "only when allowed explicitly (allow_unsealed=True, `datalane run "
            "--allow-unsealed-state`)")
        loader.load_state_dict(unsealed, allow_unsealed=True)  # the explicit opt-in
        assert loader.step == 3


def test_every_single_bit_flip_of_an_unsealed_state_file_is_refused(
        saved: tuple[Recipe, dict[str, Any]], tmp_path: Path) -> None:
    """The tester's repro: without its sha256, 13 of 44 bit flips changed the stream."""
    _, state = saved
    lane = {k: v for k, v in state["lanes"]["1"].items()}
    small = {k: v for k, v in state.items() if k not in ("sha256", "lanes")}
    small["lanes"] = {"1": lane}
    data = json.dumps(small, separators=(",", ":"), sort_keys=True).encode()
    body = data.index(b'"lanes":{"1"')  # flip the lane state, not the fingerprint document
    path = tmp_path / "s.json"
    accepted = []
    for offset in range(body, len(data)):
        flipped = bytearray(data)
        flipped[offset] ^= 1
        path.write_bytes(bytes(flipped))
        try:
            Checkpoint.load(str(path))
        except DatalaneError:
            continue
        accepted.append(offset)
    assert accepted == []


def test_the_cli_resumes_an_unsealed_state_only_with_the_flag(
        write_recipe: Callable[..., str], tmp_path: Path) -> None:
    recipe = write_recipe()
    state = tmp_path / "s.json"
    subprocess.run([sys.executable, "-m", "datalane.cli", "run", recipe, "--steps", "2",
                    "--save-state-at", "2", "--state-out", str(state)], cwd=REPO, check=True,
                   capture_output=True, timeout=120)
    unsealed = tmp_path / "unsealed.json"
    unsealed.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items()
                                    if k != "sha256"}))
    base = [sys.executable, "-m", "datalane.cli", "run", recipe, "--steps", "1", "--resume",
            str(unsealed)]
    refused = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"datalane run: error: state file {unsealed} carries no "
                                     f"sha256 of its content"), refused.stderr
    allowed = subprocess.run([*base, "--allow-unsealed-state"], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.startswith("step=2 sha256="), allowed.stdout


# -- sealed, but impossible -------------------------------------------------------------------


def _src(lane: str, source: int, cursor: list[int]) -> Callable[[dict[str, Any]], None]:
    return lambda s: s["lanes"][lane]["src"].__setitem__(source, cursor)


def test_a_block_far_past_the_records_read_is_refused(saved: tuple[Recipe, dict[str, Any]],
                                                      ) -> None:
    """The tester's repro: block 10^9 of a resealed state was served as another stream."""
    r, state = saved
    lane = state["lanes"]["2"]
    epoch, _, chunk, pos, offset = lane["src"][0]
    bad = _resealed(state, _src("2", 0, [epoch, 10**9, chunk, pos, offset]))
    docs = lane["n"][0]
    assert _restore_error(r, bad) == (
        f"lane 2 state: source 0 'web' cursor {[epoch, 10**9, chunk, pos, offset]}: block "
        f"1000000000 of 16 records, {offset} of it consumed, lies past the {docs} records the "
        f"lane has read (n.docs); the lane's blocks of epoch {epoch} before it hold "
        f"{10**9 * 16 + offset} records")


def test_an_end_flag_on_a_lane_with_data_left_is_refused(saved: tuple[Recipe, dict[str, Any]],
                                                         ) -> None:
    """The tester's repro: `end` set on a live lane made it serve padding from then on."""
    r, state = saved
    bad = _resealed(state, lambda s: s["lanes"]["1"].__setitem__("end", 1))
    cursor = state["lanes"]["1"]["src"][0]
    assert _restore_error(r, bad) == (
        f"lane 1 state is marked ended (end: 1), but source 0 'web' (weight 0.7) has not run "
        f"out: cursor {cursor}, epoch 0 of 1")


def test_an_end_flag_with_a_carry_over_is_refused(saved: tuple[Recipe, dict[str, Any]]) -> None:
    r, state = saved

    def ended(s: dict[str, Any]) -> None:
        s["lanes"]["1"]["end"] = 1
        s["lanes"]["1"]["src"] = [[1, 0, 0, -1, 0], [1, 0, 0, -1, 0]]  # both exhausted
    bad = _resealed(state, ended)
    held = state["lanes"]["1"]["pack"]["wrap"]
    assert _restore_error(r, bad).startswith(
        f"lane 1 state is marked ended (end: 1), but its packer still holds a carry-over "
        f"({str(held)[:40]}")


@pytest.mark.parametrize(("edit", "message"), [
    (_src("3", 0, [2, 0, 0, -1, 0]),
     "lane 3 state: source 0 'web' cursor [2, 0, 0, -1, 0]: epoch 2 lies past the source's 1 "
     "epochs (recipe sources[0].epochs)"),
    (_src("3", 1, [1, 1, 0, -1, 0]),
     "lane 3 state: source 1 'code' cursor [1, 1, 0, -1, 0]: epoch 1 means the source is "
     "exhausted, whose cursor is [1, 0, 0, -1, 0]"),
    (lambda s: s["lanes"]["3"]["n"].__setitem__(3, 7),
     "lane 3 state: n.tokens {tokens} + n.padding 7 = {tokens_7} tokens, but its 6 sequences "
     "of 129 tokens hold 774"),
    (lambda s: s["lanes"]["3"]["n"].__setitem__(4, {"empty_text": 10**6}),
     "lane 3 state: n.kept {kept} + skipped 1000000 documents are more than the {docs} records "
     "it has read (n.docs)"),
], ids=["epoch past the source's", "exhausted but in a block", "padding", "skipped"])
def test_impossible_cursors_and_counters_are_refused_naming_the_value(
        saved: tuple[Recipe, dict[str, Any]], edit: Callable[[dict[str, Any]], None],
        message: str) -> None:
    r, state = saved
    docs, kept, tokens, _, _ = state["lanes"]["3"]["n"]
    assert _restore_error(r, _resealed(state, edit)) == message.format(
        tokens=tokens, tokens_7=tokens + 7, kept=kept, docs=docs)


def test_a_lane_that_really_ended_still_restores(tmp_path: Path, corpus: Any) -> None:
    """The checks refuse only what a lane could never write: an ended lane's state (sources
    exhausted, packer flushed) restores and goes on padding."""
    path = tmp_path / "few.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                            for i in range(6)))
    r = load_recipe({"lanes": 2, "global_batch_size": 2, "seq_len": 32, "seed": 1,
                     "tokenizer": {"uri": corpus.tokenizer},
                     "sources": [{"name": "s", "uris": [str(path)], "epochs": 1,
                                  "chunk_bytes": 200}]})
    with Loader(r, 0, 1, Knobs(workers=1)) as loader:
        while not loader.next_step().ended:
            pass
        state = loader.state_dict()
        after = loader.next_step().global_hash()
    assert all(lane.get("end") == 1 for lane in state["lanes"].values())
    with Loader(r, 0, 1, Knobs(workers=1)) as resumed:
        resumed.load_state_dict(state)
        assert resumed.next_step().global_hash() == after
