"""The container runner's translation of a stored pod spec into podman arguments, checked
without podman: users and groups, fsGroup, read-only root filesystems, mounts, the
termination message file, env by name (no Secret value on a command line), the kubelet's
runAsNonRoot refusals, volume ownership. The containers themselves run in test_e2e.py and
test_images_run.py."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from datalane_operator import names
from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline

from playground import containers
from playground.containers import ContainerRunner, cpu_cores, quantity_bytes

from .builders import dp, pod
from .podrunner import ContainerConfigError

SECRET = "wJalrXUtnFEMI-not-a-real-key"


class FakeCore:
    """The two reads the runner makes of the API server."""

    def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        assert name == "s3-creds"
        return SimpleNamespace(data={
            "AWS_ACCESS_KEY_ID": base64.b64encode(b"AKIDEXAMPLE").decode(),
            "AWS_SECRET_ACCESS_KEY": base64.b64encode(SECRET.encode()).decode()})

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(data={"recipe.json": "{}"})


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ContainerRunner:
    monkeypatch.setattr(containers, "reap_stale", lambda: None)
    r = ContainerRunner(FakeCore(), "ml")
    users = {"sidecar:1": "65532:65532", "trainer:1": "65533:65533", "root:1": "",
             "named:1": "app"}
    monkeypatch.setattr(r, "_image_user", lambda image: users[image])
    return r


def injected(fs_group: int | None = 2000, trainer_user: int | None = 1000) -> dict[str, Any]:
    body = pod()
    body["spec"]["containers"] = body["spec"]["containers"][:1]
    if fs_group is not None:
        body["spec"]["securityContext"] = {"fsGroup": fs_group}
    if trainer_user is not None:
        body["spec"]["containers"][0]["securityContext"] = {
            "runAsUser": trainer_user, "runAsGroup": trainer_user, "runAsNonRoot": True,
            "readOnlyRootFilesystem": True}
    out: dict[str, Any] = mutate_pod(body, load_pipeline(dp(sidecar={"image": "sidecar:1"})),
                                     "sidecar:1")
    return out


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def _argv(runner: ContainerRunner, spec: dict[str, Any], name: str,
          tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    container = next(c for c in [*spec["spec"]["initContainers"], *spec["spec"]["containers"]]
                     if c["name"] == name)
    volumes = {v["name"]: tmp_path / v["name"] for v in spec["spec"]["volumes"]}
    env = runner._container_env(spec, container)
    return runner._run_argv(spec, container, f"c-{name}", volumes, env, tmp_path), env


def test_quantities() -> None:
    assert quantity_bytes("64Mi") == 64 * 1024 * 1024
    assert quantity_bytes("1Gi") == 1 << 30
    assert quantity_bytes("500M") == 500_000_000
    assert quantity_bytes("1024") == 1024
    assert cpu_cores("500m") == 0.5 and cpu_cores("2") == 2.0
    with pytest.raises(AssertionError, match="'1x'"):
        quantity_bytes("1x")


def test_the_sidecar_runs_as_the_spec_says(runner: ContainerRunner, tmp_path: Path) -> None:
    spec = injected()
    argv, env = _argv(runner, spec, names.SIDECAR_CONTAINER, tmp_path)
    # the image's user (no runAsUser), the pod's fsGroup as a supplementary group
    assert "--user" not in argv
    assert _pairs(argv, "--group-add") == ["2000"]
    # read-only root without podman's own tmpfs mounts: only the pod's volumes are writable
    assert "--read-only" in argv and "--read-only-tmpfs=false" in argv
    assert _pairs(argv, "--security-opt") == ["no-new-privileges"]
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    mounts = {v.split(":")[1]: v for v in _pairs(argv, "--volume")}
    assert mounts["/var/run/datalane"] == f"{tmp_path / names.VOLUME_SOCKET}:/var/run/datalane"
    assert mounts[names.RECIPE_MOUNT] == (  # the recipe ConfigMap, read-only
        f"{tmp_path / names.VOLUME_RECIPE}:{names.RECIPE_MOUNT}:ro")
    assert mounts["/tmp"] == f"{tmp_path / names.VOLUME_TMP}:/tmp"
    assert mounts["/dev/termination-log"] == (
        f"{tmp_path / 'datalane-sidecar.termination-log'}:/dev/termination-log")
    log = tmp_path / "datalane-sidecar.termination-log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o666  # writable by the container's user
    # the spec's command replaces the image's entry point
    assert json.loads(_pairs(argv, "--entrypoint")[0]) == ["datalane-sidecar", "serve"]
    assert argv[argv.index(json.dumps(["datalane-sidecar", "serve"])) + 1] == "sidecar:1"
    # envFrom the Secret: passed by name, the values only in podman's environment
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert "AWS_SECRET_ACCESS_KEY" in _pairs(argv, "--env")
    assert SECRET not in " ".join(argv)
    assert env["DATALANE_POD"] == "llama-worker-0"  # fieldRef metadata.name
    assert env["DATALANE_SOCKET"] == "/var/run/datalane/datalane.sock"


def test_the_trainer_runs_as_its_own_user_in_the_pod_group(runner: ContainerRunner,
                                                           tmp_path: Path) -> None:
    argv, env = _argv(runner, injected(), "pytorch", tmp_path)
    assert _pairs(argv, "--user") == ["1000:1000"]
    assert _pairs(argv, "--group-add") == ["2000"]
    assert "--read-only" in argv
    assert "--entrypoint" not in argv  # no command: the image's
    assert env["DATALANE_SOCKET"] == "/var/run/datalane/datalane.sock"
    assert argv[-1] == "trainer:1"


@pytest.mark.parametrize(("image", "message"), [
    ("root:1", "container has runAsNonRoot and image will run as root"),
    ("named:1", "container has runAsNonRoot and image has non-numeric user (app), cannot "
                "verify user is non-root"),
])
def test_run_as_non_root_is_checked_like_the_kubelet(runner: ContainerRunner, image: str,
                                                     message: str) -> None:
    spec = injected(trainer_user=None)
    trainer = spec["spec"]["containers"][0]
    trainer["image"] = image
    trainer["securityContext"] = {"runAsNonRoot": True}
    with pytest.raises(ContainerConfigError) as e:
        runner._security_args(spec, trainer)
    assert str(e.value) == message
    trainer["securityContext"]["runAsUser"] = 1000  # an explicit non-root user is enough
    assert runner._security_args(spec, trainer)[:2] == ["--user", "1000"]


def test_volume_ownership_follows_fs_group(runner: ContainerRunner, tmp_path: Path) -> None:
    """As the kubelet's SetVolumeOwnership: group fsGroup, group rw, setgid on folders, so a
    socket or ring the sidecar makes there belongs to the pod's group."""
    vol = tmp_path / "vol"
    (vol / "sub").mkdir(parents=True)
    (vol / "sub" / "f").write_text("x")
    (vol / "sub" / "f").chmod(0o600)
    runner._own(vol, 2000, 0o777)
    for path in (vol, vol / "sub"):
        st = path.stat()
        assert st.st_gid == 2000 and st.st_mode & stat.S_ISGID, path
    st = (vol / "sub" / "f").stat()
    assert st.st_gid == 2000 and stat.S_IMODE(st.st_mode) == 0o660
    assert stat.S_IMODE(vol.stat().st_mode) == 0o2777


def test_secret_key_refs_resolve_as_the_kubelet_does() -> None:
    """Both runners resolve env ``secretKeyRef`` through one function: the value, nothing for
    a missing optional one, CreateContainerConfigError's message otherwise."""
    from .podrunner import ContainerConfigError, secret_key

    secrets = {"creds": {"KEY": b"v1"}}
    assert secret_key(secrets.get, "ns", {"name": "creds", "key": "KEY"}) == "v1"
    assert secret_key(secrets.get, "ns", {"name": "gone", "key": "K", "optional": True}) is None
    with pytest.raises(ContainerConfigError, match='secret "gone" not found'):
        secret_key(secrets.get, "ns", {"name": "gone", "key": "K"})
    with pytest.raises(ContainerConfigError, match="couldn't find key NOPE in Secret ns/creds"):
        secret_key(secrets.get, "ns", {"name": "creds", "key": "NOPE"})


def test_podman_sees_the_storage_the_images_were_built_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """containers/common's own variables (a storage of its own, as `make images` used) reach
    podman; this repository's containers.conf replaces any other; the rest of the caller's
    environment does not."""
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", "/elsewhere/storage.conf")
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", "/elsewhere/registries.conf")
    monkeypatch.setenv("CONTAINERS_CONF", "/elsewhere/containers.conf")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not for podman")
    env = containers.podman_env({"EXTRA": "1"})
    assert env["CONTAINERS_STORAGE_CONF"] == "/elsewhere/storage.conf"
    assert env["CONTAINERS_REGISTRIES_CONF"] == "/elsewhere/registries.conf"
    assert env["CONTAINERS_CONF"] == str(containers.CONF)
    assert env["EXTRA"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in env
