"""``write_pod`` of a step that is already committed: nothing is written, but the pod id and
the lane states are still checked against the committed manifest, with messages that name
both sides. Local files only.
"""

from __future__ import annotations

import logging

import pytest

from datalane.spec.errors import ConfigError, MismatchError

from .conftest import Backend
from .support import FINGERPRINT, FP_DOC, commit_steps, lane_state, write_pod


def test_a_pod_writing_a_committed_step_again_gets_the_manifest_and_a_log_line(
        local: Backend, caplog: pytest.LogCaptureFixture) -> None:
    store = local.store()
    commit_steps(store, [10])
    before = local.names(10)
    with caplog.at_level(logging.INFO, logger="datalane.store"):
        uri = write_pod(store, 10, 0, 2, since=None)
    assert uri == f"{store.uri}/steps/000000000010/MANIFEST.json"
    assert local.names(10) == before
    assert [r.getMessage() for r in caplog.records] == [
        f"step 10 is already committed in {store.uri}; pod 0's lanes match, not rewritten"]


def test_another_lane_count_at_a_committed_step_names_both_sides(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    with pytest.raises(MismatchError) as err:
        store.write_pod(10, 0, {lane: lane_state(lane, 10) for lane in range(4)}, {},
                        FINGERPRINT, FP_DOC, 4)
    assert str(err.value) == (
        f"step 10 is already committed in {store.uri}/steps/000000000010/MANIFEST.json with "
        f"fingerprint ffffffffffffffff... and 8 lanes; pod 0 brings fingerprint "
        f"ffffffffffffffff... and 4 lanes")


@pytest.mark.parametrize("pod", ["a/b", "", True])
def test_a_bad_pod_id_is_refused_at_a_committed_step_too(local: Backend, pod: object) -> None:
    """The id is checked before the manifest is read: a committed step would otherwise accept
    a pod id that can name no object. ``True`` is no pod id, although its str would name
    ``pod-True.json``."""
    store = local.store()
    commit_steps(store, [10])
    states = {lane: lane_state(lane, 10) for lane in range(4)}
    for step in (10, 20):
        with pytest.raises(ConfigError) as err:
            store.write_pod(step, pod, states, {}, FINGERPRINT, FP_DOC, 8)  # type: ignore[arg-type]
        assert str(err.value) == (
            f"pod id {pod!r} cannot name an object: use 1-128 letters, digits, '.', '_' or "
            f"'-', starting with a letter or digit")
    with pytest.raises(ConfigError, match="cannot name an object"):
        store.pod_uri(10, pod)  # type: ignore[arg-type]
    assert store.committed_steps() == [10]
    assert not local.fs.exists(f"{local.base}/steps/{20:012d}")
