"""Injected storage faults against a real S3 endpoint never yield a committed-but-broken
checkpoint; transient faults are retried, permanent ones surface at once, naming the object."""

from __future__ import annotations

import errno

import pytest

from datalane.spec.errors import StorageError
from datalane.store import is_transient

from .conftest import Backend
from .faults import KINDS, FaultyFS, make_fault
from .support import LANES, commit_steps, lane_state, write_pod, write_step

EXPECTED = {lane: lane_state(lane, 10) for lane in range(LANES)}


def _sidecars(backend: Backend, fs: FaultyFS, retries: int) -> list[BaseException]:
    """Two pods each write their lanes of step 10, then try to commit (the sidecar protocol)."""
    store = backend.store(filesystem=fs, retries=retries)
    errors: list[BaseException] = []
    for pod in range(2):
        try:
            write_pod(store, 10, pod, 2, None)
        except StorageError as e:
            errors.append(e)
        try:
            store.commit(10)
        except StorageError as e:
            errors.append(e)
    return errors


def _assert_never_broken(backend: Backend) -> None:
    """Every manifest present either loads exactly the right states or is refused."""
    clean = backend.store()
    for step in clean.committed_steps():
        try:
            ckpt = clean.load(step)
        except StorageError as e:
            assert not e.transient and backend.uri in str(e)
            continue
        assert ckpt.lanes == EXPECTED
    for step in clean.committed_steps(verify=True):
        assert clean.load(step).lanes == EXPECTED


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nth", [1, 2, 3], ids=["pod0-put", "pod1-put", "manifest-put"])
def test_put_fault_is_retried(s3: Backend, kind: str, nth: int) -> None:
    fs = FaultyFS(s3.fs).on("pipe_file", nth, kind)
    errors = _sidecars(s3, fs, retries=3)
    assert errors == []
    assert len(fs.injected) == 1
    assert fs.calls["pipe_file"] == 5  # 3 objects and HEAD.json, one of them written twice
    assert s3.store().load(10).lanes == EXPECTED
    assert s3.names(10) == ["MANIFEST.json", "pod-0.json", "pod-1.json"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_put_fault_without_retries_never_commits_broken(s3: Backend, kind: str,
                                                         nth: int) -> None:
    fs = FaultyFS(s3.fs).on("pipe_file", nth, kind)
    errors = _sidecars(s3, fs, retries=0)
    assert errors, "the fault must surface when retries are off"
    assert all(isinstance(e, StorageError) for e in errors)
    assert any(s3.uri in str(e) for e in errors)
    _assert_never_broken(s3)
    # Recovery: the sidecars write again and the step commits.
    clean = s3.store()
    write_step(clean, 10)
    assert clean.commit(10) is not None
    assert clean.load(10).lanes == EXPECTED


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "timeout_after_write"])
@pytest.mark.parametrize("nth", range(1, 9))
def test_read_fault_without_retries_never_commits_broken(s3: Backend, kind: str,
                                                          nth: int) -> None:
    fs = FaultyFS(s3.fs).on("cat_file", nth, kind)
    _sidecars(s3, fs, retries=0)
    assert fs.injected
    _assert_never_broken(s3)
    clean = s3.store()
    write_step(clean, 10)
    assert clean.commit(10) is not None


def test_object_missing_when_read_back_after_its_put_is_written_again(s3: Backend) -> None:
    """S3-compatible stores can show no object for a moment while another writer's PUT of the
    same name is in flight (seen with racing commits on moto): the write is retried, not
    failed as a permanent "not found"."""
    fs = FaultyFS(s3.fs).on("cat_file", 2, "missing")  # 1: MANIFEST.json (absent)
    errors = _sidecars(s3, fs, retries=3)
    assert errors == []
    assert fs.injected[0][0] == "cat_file" and fs.injected[0][3].endswith("pod-0.json")
    assert fs.calls["pipe_file"] == 5  # pod-0 written twice, and HEAD.json
    assert s3.store().load(10).lanes == EXPECTED


@pytest.mark.parametrize("kind", ["server_error", "read_timeout", "connection_dropped"])
def test_read_faults_are_retried(s3: Backend, kind: str) -> None:
    write_step(s3.store(), 10)
    fs = FaultyFS(s3.fs).on("cat_file", 1, kind).on("cat_file", 3, kind).on("find", 1, kind)
    store = s3.store(filesystem=fs)
    assert store.commit(10) is not None
    assert store.load(10).lanes == EXPECTED
    assert store.committed_steps() == [10]
    assert len(fs.injected) == 3


def test_persistent_fault_gives_up_as_transient(s3: Backend) -> None:
    fs = FaultyFS(s3.fs).always_fail("pipe_file", "server_error")
    store = s3.store(filesystem=fs, retries=2)
    with pytest.raises(StorageError) as err:
        write_pod(store, 10, 0, 2, None)
    assert err.value.transient is True
    assert f"{store.uri}/steps/000000000010/pod-0.json" in str(err.value)
    assert "gave up after 3 attempts" in str(err.value)
    assert fs.calls["pipe_file"] == 3
    assert s3.names(10) == []


def test_persistent_truncation_never_commits(s3: Backend) -> None:
    """A store that keeps truncating one pod's PUTs: that pod fails, the step never commits."""
    write_pod(s3.store(), 10, 1, 2, None)
    fs = FaultyFS(s3.fs).always_fail("pipe_file", "truncate")
    store = s3.store(filesystem=fs, retries=2)
    with pytest.raises(StorageError, match="differ from the") as err:
        write_pod(store, 10, 0, 2, None)
    assert err.value.transient is True
    with pytest.raises(StorageError, match=r"corrupt pod object .*pod-0\.json"):
        s3.store().commit(10)
    assert "MANIFEST.json" not in s3.names(10)


def test_permanent_fault_is_not_retried(s3: Backend) -> None:
    fs = FaultyFS(s3.fs).always_fail("pipe_file", "access_denied")
    store = s3.store(filesystem=fs, retries=5)
    with pytest.raises(StorageError, match="permission denied") as err:
        write_pod(store, 10, 0, 2, None)
    assert err.value.transient is False
    assert fs.calls["pipe_file"] == 1
    assert "pod-0.json" in str(err.value)
    write_step(s3.store(), 10)
    s3.store().commit(10)
    reader = s3.store(filesystem=FaultyFS(s3.fs).always_fail("cat_file", "access_denied"))
    with pytest.raises(StorageError, match=r"MANIFEST\.json: permission denied"):
        reader.load(10)


def test_missing_bucket_is_permanent(s3_bucket: object, s3: Backend) -> None:
    opts = s3.options
    store = Backend("s3", "s3://no-such-bucket-datalane/run", opts).store(retries=5)
    with pytest.raises(StorageError) as err:
        write_pod(store, 1, 0, 2, None)
    assert err.value.transient is False
    # the write first checks for a committed manifest: the bucket, not an object, is missing
    assert str(err.value) == (
        "cannot read s3://no-such-bucket-datalane/run/steps/000000000001/MANIFEST.json: the "
        "bucket 'no-such-bucket-datalane' does not exist (deleted, or a typo in the URI?)")


def test_a_deleted_bucket_is_named_not_taken_for_a_missing_checkpoint(s3_bucket: object,
                                                                       s3: Backend) -> None:
    """A deleted bucket is named as such (the store said "the object does not exist", or "no
    committed checkpoint", when the whole bucket had been deleted)."""
    store = s3.store()
    commit_steps(store, [10])
    bucket = s3.base.split("/", 1)[0]
    s3.fs.rm(bucket, recursive=True)  # every object, then the bucket itself
    s3.fs.invalidate_cache()
    assert not s3.fs.exists(bucket)
    gone = f"the bucket {bucket!r} does not exist (deleted, or a typo in the URI?)"
    steps = f"{store.uri}/steps"
    calls = {
        "list": (store.committed_steps, f"cannot list {steps}: {gone}"),
        "load": (lambda: store.load(10),
                 f"cannot read {steps}/000000000010/MANIFEST.json: {gone}"),
        "audit": (store.audit, f"cannot list {steps}: {gone}"),
        "write": (lambda: write_pod(store, 20, 0, 2, 10),
                  f"cannot read {steps}/000000000020/MANIFEST.json: {gone}"),
        "gc": (lambda: store.gc(keep=1), f"cannot list {steps}: {gone}"),
    }
    for verb, (call, message) in calls.items():
        with pytest.raises(StorageError) as err:
            call()
        assert (verb, str(err.value), err.value.transient) == (verb, message, False)


@pytest.mark.parametrize(("exc", "transient"), [
    (make_fault("server_error"), True),
    (make_fault("internal_error"), True),
    (make_fault("read_timeout"), True),
    (make_fault("connection_dropped"), True),
    (make_fault("access_denied"), False),
    (TimeoutError("timed out"), True),
    (ConnectionResetError(errno.ECONNRESET, "reset"), True),
    (OSError(errno.EIO, "I/O error"), True),
    (FileNotFoundError(errno.ENOENT, "gone"), False),
    (PermissionError(errno.EACCES, "denied"), False),
    (OSError(errno.ENOSPC, "disk full"), False),
    (ValueError("bug"), False),
])
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient
