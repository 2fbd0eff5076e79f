"""Names and digests read from storage match as whole strings.

A regular expression ending in ``$`` also matches before a final newline: ``"a" * 64 + "\\n"``
passed as a SHA-256, ``"pod-a.json\\n"`` as a pod object, ``"000000000001\\n"`` as a step
directory. Each check below is tried with the good string (accepted) and the same string with a
newline after it (refused), and a ``HEAD.json`` whose digest is 64 characters but not hex is
malformed, not a HEAD that was replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from datalane_sidecar import server

from datalane.spec.errors import ConfigError
from datalane.store import manifest
from datalane.store.history import head_record, read_head
from datalane.store.layout import is_pod_object_name, pod_id_of, pod_object_name, step_of_dir
from datalane.store.podstate import PodObject
from tests.store.support import FINGERPRINT, FP_DOC, lane_state

SHA = "0123456789abcdef" * 4


def test_pod_ids_and_pod_object_names_are_whole_names() -> None:
    assert pod_object_name("trainer-0") == "pod-trainer-0.json"
    with pytest.raises(ConfigError, match=r"pod id 'trainer-0\\n' cannot name an object"):
        pod_object_name("trainer-0\n")
    assert is_pod_object_name("pod-trainer-0.json")
    assert not is_pod_object_name("pod-trainer-0.json\n")
    assert pod_id_of("pod-trainer-0.json") == "trainer-0"
    with pytest.raises(ConfigError, match=r"'pod-trainer-0.json\\n' is not a pod object name"):
        pod_id_of("pod-trainer-0.json\n")


def test_a_step_directory_is_its_digits_only() -> None:
    assert step_of_dir("s3://b/run/000000000012") == 12
    assert step_of_dir("s3://b/run/000000000012/") == 12  # (a folder's trailing slash)
    assert step_of_dir("s3://b/run/000000000012\n") is None
    assert step_of_dir("s3://b/run/00000000012") is None  # (11 digits)


def test_a_window_digest_given_as_hex_is_64_hex_digits_only() -> None:
    def build(hex_digest: str) -> PodObject:
        return PodObject.build(2, "p", {0: lane_state(0, 2)}, {1: {0: hex_digest}},
                               FINGERPRINT, FP_DOC, 1)

    assert build(SHA.upper()).digests == {1: {0: SHA}}  # (read in either case)
    with pytest.raises(ConfigError, match=r"digest of step 1 lane 0 must be a 32-byte digest "
                                          r"or 64 hex characters, got '0123"):
        build(SHA + "\n")


def test_a_manifests_sha256_fields_are_64_lowercase_hex_digits_only() -> None:
    assert manifest._hex(SHA) == SHA
    for bad in (SHA + "\n", SHA.upper(), "z" * 64, SHA[:-1]):
        with pytest.raises(ValueError, match="expected a 64-character lowercase hex SHA-256"):
            manifest._hex(bad)


def test_a_head_whose_digest_is_not_hex_is_malformed() -> None:
    head, problem = read_head(head_record(None, 12, SHA, 3), "mem://run/HEAD.json", None)
    assert problem is None and head is not None and (head.step, head.sha256) == (12, SHA)
    for bad in ("z" * 64, SHA + "\n"):
        head, problem = read_head(head_record(None, 12, bad, 3), "mem://run/HEAD.json", None)
        assert head is None
        assert problem == (f"mem://run/HEAD.json is malformed: expected a SHA-256 (64 "
                           f"lowercase hex digits), got {bad!r}")


def test_the_sidecar_removes_only_its_own_stale_rings(tmp_path: Path) -> None:
    names = ["datalane-0123456789abcdef.shm", "datalane-0123456789abcdef.shm\n",
             "datalane-0123456789abcdef.shm.keep", "other.shm"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    server._check_socket_path(str(tmp_path / "data.sock"))
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
