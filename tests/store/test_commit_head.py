"""What a commit links to and what it leaves in ``HEAD.json``, and what a listing counts.

A commit links its manifest to the newest committed step below it that parses, counts its
place in the chain from there, and points ``HEAD.json`` at itself unless a newer step is
named there already; a commit repeated after a crash between the manifest and HEAD.json
writes HEAD.json then. Only ``steps/<12 digits>/<file>`` counts as a step's file. Local files
only.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from datalane.spec.errors import ConfigError
from datalane.store.history import read_head

from .conftest import Backend
from .support import commit_steps, write_step


def _head(local: Backend) -> dict[str, object]:
    return json.loads(local.fs.cat_file(f"{local.base}/HEAD.json"))


def _sha(local: Backend, step: int) -> str:
    return hashlib.sha256(local.read(step, "MANIFEST.json")).hexdigest()


def test_a_repeated_commit_writes_the_head_json_a_crash_left_out(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20])
    local.fs.rm(f"{local.base}/HEAD.json")  # the commit of 20 died after its manifest
    assert store.commit(20) == store.manifest(20)
    assert _head(local) == {"format": "datalane.head/v1", "step": 20, "seq": 1,
                            "sha256": _sha(local, 20)}
    assert store.commit(10) is not None  # an older step again: HEAD.json stays at 20
    assert _head(local)["step"] == 20


def test_a_head_json_that_does_not_parse_is_rewritten_by_the_next_commit(
        local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    local.fs.pipe_file(f"{local.base}/HEAD.json", b'{"format": "datalane.he')
    write_step(store, 20, since=10)
    assert store.commit(20) is not None
    head, problem = read_head(local.fs.cat_file(f"{local.base}/HEAD.json"), "HEAD.json", None)
    assert problem is None and head is not None
    assert (head.step, head.sha256, head.seq) == (20, _sha(local, 20), 1)


def test_a_commit_links_past_a_manifest_that_does_not_parse(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20])
    data = local.read(20, "MANIFEST.json")
    local.write(20, "MANIFEST.json", data[:40])  # a PUT that stored a truncated body
    write_step(store, 30, since=10)
    manifest = store.commit(30)
    assert manifest is not None
    assert (manifest.previous_step, manifest.previous_sha256, manifest.seq) == (
        10, _sha(local, 10), 1)
    assert [s for s, _ in manifest.ledger] == list(range(10, 30))


def test_only_files_directly_in_a_step_directory_count(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    for path in (f"steps/{10:012d}/old/MANIFEST.json", f"steps/{20:012d}/copy/MANIFEST.json",
                 "steps/20/MANIFEST.json",  # not 12 digits
                 "steps/MANIFEST.json", "MANIFEST.json", f"steps/{30:012d}/notes.txt"):
        local.fs.makedirs(f"{local.base}/{path}".rsplit("/", 1)[0], exist_ok=True)
        local.fs.pipe_file(f"{local.base}/{path}", b"{}")
    assert store.committed_steps() == [10]
    assert store.latest_committed() == 10
    report = store.audit()
    assert [e.step for e in report.entries] == [10]
    assert report.uncommitted == (30,)  # a step directory with no manifest
    assert store.commit(30) is None


def test_an_incomplete_step_is_logged_with_its_missing_lanes(
        local: Backend, caplog: pytest.LogCaptureFixture) -> None:
    store = local.store()
    write_step(store, 10, pods=4, skip=(1, 3))  # lanes 0-1 and 4-5 written
    with caplog.at_level(logging.INFO, logger="datalane.store"):
        assert store.commit(10) is None
        assert store.commit(20) is None
        write_step(store, 10, pods=4)
        assert store.commit(10) is not None
    assert [r.getMessage() for r in caplog.records] == [
        "step 10 not committed yet: 2 pod objects, lanes 2-3, 6-7 missing",
        "step 20 not committed yet: 0 pod objects, lanes all missing",
        f"committed step 10 in {store.uri} (8 lanes in 4 objects, 10 ledger entries)"]


@pytest.mark.parametrize("step", [-1, True, 10**12, "3"])
def test_every_step_argument_is_checked_before_storage_is_touched(local: Backend,
                                                                   step: object) -> None:
    store = local.store()
    why = f"a checkpoint step must be an integer in [0, 10^12), got {step!r}"
    calls = {
        "commit": lambda: store.commit(step),  # type: ignore[arg-type]
        "write_pod": lambda: store.write_pod(step, 0, {}, {}, "f" * 64, None, 8),  # type: ignore[arg-type]
        "discard": lambda: store.discard(step),  # type: ignore[arg-type]
        "is_committed": lambda: store.is_committed(step),  # type: ignore[arg-type]
        "pod_uri": lambda: store.pod_uri(step, 0),  # type: ignore[arg-type]
        "manifest": lambda: store.manifest(step),  # type: ignore[arg-type]
        "load": lambda: store.load(step),  # type: ignore[arg-type]
    }
    for name, call in calls.items():
        with pytest.raises(ConfigError) as err:
            call()
        assert (name, str(err.value)) == (name, why)
    assert not local.fs.exists(local.base)


def test_a_committed_step_committed_again_keeps_its_bytes_after_an_older_commit(
        local: Backend) -> None:
    """Step 20 committed after step 30 (out of order): committing 30 again returns its
    manifest as committed (linking to 10), never one derived anew (linking to 20)."""
    store = local.store()
    commit_steps(store, [10, 30])
    committed = local.read(30, "MANIFEST.json")
    write_step(store, 20, since=10)
    assert store.commit(20) is not None
    again = store.commit(30)
    assert again is not None and again.previous_step == 10
    assert local.read(30, "MANIFEST.json") == committed
    assert store.audit().ok
