"""Plays kubelet with real containers: every container of a pod, from the pod spec **as the
API server stored it**, runs in podman.

:class:`ContainerRunner` is the pod runner of :mod:`playground.podrunner` with containers
instead of local processes (``podrunner.make_runner(..., "containers")`` picks it). For each
pod it does what a kubelet with a CRI runtime does:

* **volumes** on the host, under the runner's folder: an ``emptyDir`` is a folder, or a
  ``tmpfs`` mounted there when its medium is ``Memory`` (``sizeLimit`` as its size); a
  ``configMap`` and a ``secret`` are folders of their keys (``defaultMode``); every volume is
  owned by group ``fsGroup`` with the setgid bit on folders, as the kubelet's volume ownership
  does, so files made in a shared ``emptyDir`` (the socket, the shared-memory rings) belong
  to the pod's group; a ``projected`` service-account volume is an empty folder (no test
  container talks to the API server). Mounts are bind mounts, ``readOnly`` ones ``:ro``;
* **init containers in order**: a native sidecar (``restartPolicy: Always``) is started and
  the next container waits for its **startup probe**, executed inside it with ``podman
  exec`` every ``periodSeconds`` up to ``failureThreshold`` times; a plain init container
  must exit 0; then the main containers;
* each container with the spec's **command/args** (``command`` replaces the image's entry
  point, ``args`` its CMD, ``$(VAR)`` expanded), **env** (``value``, ``fieldRef``
  ``metadata.name``, ``secretKeyRef``) and **envFrom** Secrets, passed to podman by name so
  no value is on a command line; the **security context** of the container over the pod's:
  ``runAsUser``/``runAsGroup`` (``--user``), ``fsGroup`` and ``supplementalGroups``
  (``--group-add``), ``runAsNonRoot`` checked against the image's user (refused like the
  kubelet: ``CreateContainerConfigError``), ``readOnlyRootFilesystem`` (``--read-only``
  without podman's extra tmpfs mounts: only the pod's volumes are writable),
  ``allowPrivilegeEscalation: false`` (``no-new-privileges``), ``capabilities``; cpu and
  memory **limits**; the termination message file at ``terminationMessagePath`` (a host file,
  mode 0666, bind-mounted, read back into the pod status by ``report_exit``);
* the trainer container is started once per local rank, each with the ``RANK``,
  ``WORLD_SIZE`` and ``LOCAL_RANK`` that torchrun would give its worker processes in that
  pod (one container per worker process, sharing the pod's volumes).

What differs from a node, on purpose: the containers use the **host network** (the API
server and the moto S3 server of the tests listen on loopback only), images are never pulled
(``--pull=never``: a missing image is ``ErrImageNeverPull``), GPU limits are ignored.
podman runs with ``images/containers.conf`` (runc, cgroupfs, explicit rlimits).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .podrunner import (
    ROOT,
    ContainerConfigError,
    PodRunError,
    PodRunner,
    RunningPod,
    _now,
    expand,
    secret_key,
)

CONF = ROOT / "images" / "containers.conf"
IMAGE_TAG = "e2e"  # what the tests' pod specs name: datalane-sidecar:e2e (stack.SIDECAR_IMAGE)
LABEL = "io.datalane.e2e.runner"  # on every container: the pid of the test process
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?$")
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (``64Mi``, ``1Gi``, ``500M``, ``1024``) in bytes."""
    m = _QUANTITY.match(str(text))
    if m is None or m.group(2) == "m":
        raise PodRunError(f"memory quantity {text!r} is not understood by the container runner")
    return int(float(m.group(1)) * _FACTORS[m.group(2)])


def cpu_cores(text: str) -> float:
    """A Kubernetes cpu quantity (``500m``, ``2``) in cores."""
    s = str(text)
    return int(s[:-1]) / 1000 if s.endswith("m") else float(s)


def podman_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """podman's environment: a few of ours, containers/common's own settings
    (``CONTAINERS_STORAGE_CONF`` and the like: the storage `make images` built into), and this
    repository's ``containers.conf``."""
    base = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR")
            or k.startswith("CONTAINERS_")}
    return {**base, "CONTAINERS_CONF": str(CONF), **(extra or {})}


def podman(*args: str, check: bool = True, timeout: float = 120,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("podman")
    if exe is None:
        raise PodRunError("podman is not installed: run images/setup.sh (`make images` does)")
    proc = subprocess.run([exe, *args], env=podman_env(env), text=True, capture_output=True,
                          check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise PodRunError(f"podman {' '.join(args[:3])} ... exited with {proc.returncode}: "
                          f"{proc.stderr.strip()[-2000:]}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> None:
    """Remove containers and tmpfs mounts that runners of dead test processes left behind
    (a test process killed before its ``close``)."""
    out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format",
                 "{{.ID}} {{.Labels}}", check=False).stdout
    stale = []
    for line in out.splitlines():
        m = re.search(rf"{re.escape(LABEL)}:(\d+)", line)
        if m and not _alive(int(m.group(1))):
            stale.append(line.split()[0])
    if stale:
        podman("rm", "-f", "-t", "0", *stale, check=False)
    with open("/proc/mounts") as f:
        mounts = [ln.split()[1] for ln in f if ln.split()[0] == "tmpfs"]
    for path in mounts:
        m = re.match(r"^/tmp/dlc-(\d+)-", path)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["umount", "-l", path], check=False, capture_output=True)


@dataclass
class ContainerPod(RunningPod):
    """A pod of the container runner: the podman clients of its containers (``sidecar``,
    ``trainers``) and the containers' names, main ones and sidecars apart."""

    mains: list[str] = field(default_factory=list)
    sidecars: list[str] = field(default_factory=list)


class ContainerRunner(PodRunner):
    """Run every container of the datalane pods in podman (see the module docstring)."""

    def __init__(self, core: Any, namespace: str, network: str = "host") -> None:
        super().__init__(core, namespace)
        shutil.rmtree(self.root, ignore_errors=True)  # the process runner's folder: unused
        reap_stale()
        self.root = Path(tempfile.mkdtemp(prefix=f"dlc-{os.getpid()}-", dir="/tmp"))
        self.root.chmod(0o755)  # containers of other users traverse it to their mounts
        self.id = self.root.name.rsplit("-", 1)[1].lower()
        self.network = network
        self.containers: list[str] = []
        self.mounts: list[Path] = []

    # -- the pod's world on the host ------------------------------------------------------
    def _pod_security(self, pod: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = pod["spec"].get("securityContext") or {}
        return out

    def _own(self, path: Path, fs_group: int | None, mode: int) -> None:
        """The kubelet's volume ownership: group fsGroup, group rw, setgid on folders."""
        path.chmod(mode)
        if fs_group is None:
            return
        for p in [path, *path.rglob("*")]:
            os.lchown(p, -1, fs_group)
            extra = 0o2070 if p.is_dir() else 0o060
            p.chmod((p.stat().st_mode & 0o7777) | extra)

    def _volumes(self, pod: dict[str, Any], folder: Path) -> dict[str, Path]:
        fs_group = self._pod_security(pod).get("fsGroup")
        out: dict[str, Path] = {}
        for vol in pod["spec"].get("volumes") or []:
            local = folder / "volumes" / vol["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in vol:
                spec = vol["emptyDir"] or {}
                if spec.get("medium") == "Memory":
                    size = quantity_bytes(spec.get("sizeLimit") or "64Mi")
                    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777",
                                    "tmpfs", str(local)], check=True, capture_output=True)
                    self.mounts.append(local)
                self._own(local, fs_group, 0o777)
            elif "configMap" in vol:
                cm = self.core.read_namespaced_config_map(vol["configMap"]["name"],
                                                          self.namespace)
                items = vol["configMap"].get("items") or [{"key": k, "path": k}
                                                          for k in cm.data]
                mode = vol["configMap"].get("defaultMode", 0o644)
                for item in items:
                    path = local / item["path"]
                    path.write_text(cm.data[item["key"]])
                    path.chmod(item.get("mode", mode))
                self._own(local, fs_group, 0o755)
            elif "secret" in vol:
                name = vol["secret"]["secretName"]
                secret = self._secret(name)
                if secret is None:
                    if vol["secret"].get("optional"):
                        continue
                    raise ContainerConfigError(f'secret "{name}" not found')
                mode = vol["secret"].get("defaultMode", 0o644)
                for key, value in secret.items():
                    path = local / key
                    path.write_bytes(value)
                    path.chmod(mode)
                self._own(local, fs_group, 0o755)
            elif "projected" in vol:  # the service-account token: no test container uses it
                self._own(local, fs_group, 0o755)
            else:
                raise PodRunError(f"volume {vol['name']} of {pod['metadata']['name']} is not an "
                                  f"emptyDir, configMap, secret or projected volume; the "
                                  f"container runner cannot mount it")
            out[vol["name"]] = local
        return out

    def _container_env(self, pod: dict[str, Any], container: dict[str, Any],
                       ) -> dict[str, str]:
        """The container's variables as the kubelet resolves them (the image's own ENV is
        podman's part)."""
        env: dict[str, str] = {}
        for ref in container.get("envFrom") or []:
            if "secretRef" in ref:
                secret = self._secret(ref["secretRef"]["name"])
                if secret is None and not ref["secretRef"].get("optional"):
                    raise ContainerConfigError(f'secret "{ref["secretRef"]["name"]}" not found')
                prefix = ref.get("prefix", "")
                env.update({prefix + k: v.decode() for k, v in (secret or {}).items()})
            elif "configMapRef" in ref:
                cm = self.core.read_namespaced_config_map(ref["configMapRef"]["name"],
                                                          self.namespace)
                env.update({ref.get("prefix", "") + k: v for k, v in (cm.data or {}).items()})
            else:
                raise PodRunError(f"envFrom {ref} is not supported by the container runner")
        for e in container.get("env") or []:
            source = e.get("valueFrom") or {}
            field = source.get("fieldRef", {}).get("fieldPath")
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif field == "metadata.name":
                env[e["name"]] = pod["metadata"]["name"]
            elif field == "metadata.namespace":
                env[e["name"]] = pod["metadata"].get("namespace", self.namespace)
            elif field and (m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]",
                                              field)):
                env[e["name"]] = (pod["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
            elif field in ("status.podIP", "status.hostIP"):
                env[e["name"]] = "127.0.0.1"  # the host network's pod
            elif "secretKeyRef" in source:
                value = secret_key(self._secret, self.namespace, source["secretKeyRef"])
                if value is not None:
                    env[e["name"]] = value
            elif not source:  # an empty value: the API server drops "value: ''", as
                env[e["name"]] = ""  # the kubelet then gives the variable as empty
            else:
                raise PodRunError(f"env {e} is not supported by the container runner")
        return env

    def _image_user(self, image: str) -> str:
        proc = podman("image", "inspect", "--format", "{{.Config.User}}", image, check=False)
        if proc.returncode != 0:
            raise _ImageMissing(f'Container image "{image}" is not present with pull policy '
                                f"of Never")
        return proc.stdout.strip()

    def _security_args(self, pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
        psc, csc = self._pod_security(pod), container.get("securityContext") or {}

        def pick(key: str) -> Any:
            return csc[key] if key in csc else psc.get(key)
        uid, gid = pick("runAsUser"), pick("runAsGroup")
        args: list[str] = []
        image_user = self._image_user(container["image"])
        if pick("runAsNonRoot"):
            effective = str(uid) if uid is not None else image_user.split(":")[0]
            if not effective or effective in ("0", "root"):
                raise ContainerConfigError("container has runAsNonRoot and image will run as "
                                           "root")
            if not effective.isdigit():
                raise ContainerConfigError(f"container has runAsNonRoot and image has "
                                           f"non-numeric user ({effective}), cannot verify user "
                                           f"is non-root")
        if uid is not None or gid is not None:
            user = str(uid) if uid is not None else image_user.split(":")[0] or "0"
            if gid is not None:
                user += f":{gid}"
            args += ["--user", user]
        groups = [*([psc["fsGroup"]] if psc.get("fsGroup") is not None else []),
                  *(psc.get("supplementalGroups") or [])]
        for g in groups:
            args += ["--group-add", str(g)]
        if csc.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        if csc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if csc.get("privileged"):
            args += ["--privileged"]
        caps = csc.get("capabilities") or {}
        for cap in caps.get("drop") or []:
            args += ["--cap-drop", cap]
        for cap in caps.get("add") or []:
            args += ["--cap-add", cap]
        return args

    def _resource_args(self, container: dict[str, Any]) -> list[str]:
        limits = (container.get("resources") or {}).get("limits") or {}
        args = []
        if "memory" in limits:
            args += ["--memory", str(quantity_bytes(limits["memory"]))]
        if "cpu" in limits:
            args += ["--cpus", str(cpu_cores(limits["cpu"]))]
        return args  # nvidia.com/gpu and other extended resources: no device here

    def _run_argv(self, pod: dict[str, Any], container: dict[str, Any], name: str,
                  volumes: dict[str, Path], env: dict[str, str], folder: Path) -> list[str]:
        argv = ["run", "--name", name, "--pull=never", "--network", self.network,
                "--label", f"{LABEL}={os.getpid()}", "--label",
                f"io.datalane.e2e.pod={pod['metadata']['name']}", "--stop-timeout", "30",
                "--log-driver", "none"]
        argv += self._security_args(pod, container)
        argv += self._resource_args(container)
        for m in container.get("volumeMounts") or []:
            host = volumes[m["name"]]
            if m.get("subPath"):
                host = host / m["subPath"]
                host.mkdir(parents=True, exist_ok=True)
            argv += ["--volume", f"{host}:{m['mountPath']}" + (":ro" if m.get("readOnly")
                                                               else "")]
        term = container.get("terminationMessagePath") or "/dev/termination-log"
        log = folder / f"{container['name']}.termination-log"
        if not log.exists():
            log.touch()
            log.chmod(0o666)  # as the kubelet makes it: any user of the container writes it
        argv += ["--volume", f"{log}:{term}"]
        for key in env:
            argv += ["--env", key]  # the value from podman's environment: off the command line
        if container.get("workingDir"):
            argv += ["--workdir", container["workingDir"]]
        command = [expand(a, env) for a in container.get("command") or []]
        args = [expand(a, env) for a in container.get("args") or []]
        if command:
            argv += ["--entrypoint", json.dumps(command)]
        argv.append(container["image"])
        return argv + args

    def _launch(self, pod: dict[str, Any], container: dict[str, Any], name: str,
                volumes: dict[str, Path], env: dict[str, str], folder: Path,
                log: Path) -> subprocess.Popen[bytes]:
        argv = self._run_argv(pod, container, name, volumes, env, folder)
        self.containers.append(name)
        with open(log, "ab") as f:
            # attached: the podman client lives as long as the container and exits with its
            # exit code; its output is the container's
            return subprocess.Popen([shutil.which("podman") or "podman", *argv],
                                    env=podman_env(env), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)

    # -- running ---------------------------------------------------------------------------
    def start(self, pod: dict[str, Any], extra_env: dict[str, str] | None = None,
              trainer: str = "pytorch", probe_timeout: float = 120.0) -> RunningPod:
        name = pod["metadata"]["name"]
        self.started += 1
        folder = self.root / f"{self.started}"
        folder.mkdir(parents=True)
        folder.chmod(0o755)
        inits = pod["spec"].get("initContainers") or []
        (side,) = [c for c in inits if c.get("restartPolicy") == "Always"]
        try:
            volumes = self._volumes(pod, folder)
        except ContainerConfigError as e:
            self.report_config_error(pod, side, str(e))
            raise
        running: ContainerPod | None = None
        for init in inits:
            cname = f"dl{self.id}-{self.started}-{init['name']}"
            try:
                env = self._container_env(pod, init)
                self._security_args(pod, init)  # config errors before anything runs
            except ContainerConfigError as e:
                self.report_config_error(pod, init, str(e))
                raise
            except _ImageMissing as e:
                self._report_waiting(pod, init, "ErrImageNeverPull", str(e))
                raise
            log = folder / ("sidecar.log" if init is side else f"{init['name']}.log")
            started = _now()
            proc = self._launch(pod, init, cname, volumes, env, folder, log)
            if init.get("restartPolicy") != "Always":
                if proc.wait(timeout=probe_timeout) != 0:
                    self.report_exit(pod, init, folder, proc.returncode, started)
                    raise PodRunError(f"init container {init['name']} of {name} exited with "
                                      f"{proc.returncode}:\n{log.read_text(errors='replace')}")
                continue
            if init is side:
                running = ContainerPod(name, folder, proc)
                self.pods.append(running)
                running.sidecars.append(cname)
            try:
                self._probe_container(name, cname, init, proc, log, probe_timeout)
            except PodRunError:
                if proc.poll() is not None:
                    self.report_exit(pod, init, folder, proc.returncode, started)
                raise
        assert running is not None
        (main,) = [c for c in pod["spec"]["containers"] if c["name"] == trainer]
        try:
            env = self._container_env(pod, main)
            self._security_args(pod, main)
        except ContainerConfigError as e:
            self.report_config_error(pod, main, str(e))
            raise
        except _ImageMissing as e:
            self._report_waiting(pod, main, "ErrImageNeverPull", str(e))
            raise
        nproc, nnodes = int(env["PET_NPROC_PER_NODE"]), int(env["PET_NNODES"])
        node = int(pod["metadata"]["labels"]["training.kubeflow.org/replica-index"])
        for local_rank in range(nproc):  # torchrun's worker processes in this pod
            renv = {**env, **(extra_env or {}), "LOCAL_RANK": str(local_rank),
                    "RANK": str(node * nproc + local_rank), "WORLD_SIZE": str(nnodes * nproc)}
            out = folder / f"trainer-{local_rank}.log"
            cname = f"dl{self.id}-{self.started}-{main['name']}-{local_rank}"
            running.trainers.append(self._launch(pod, main, cname, volumes, renv, folder, out))
            running.outputs.append(out)
            running.mains.append(cname)
        return running

    def _report_waiting(self, pod: dict[str, Any], container: dict[str, Any], reason: str,
                        message: str) -> None:
        self._set_container_status(pod["metadata"]["name"], container["name"], {
            "name": container["name"], "image": container.get("image", ""), "imageID": "",
            "ready": False, "started": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}})

    def _probe_container(self, pod: str, cname: str, container: dict[str, Any],
                         proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
        """The startup probe, executed in the container as the kubelet does (``exec``)."""
        probe = container.get("startupProbe")
        if probe is None:
            return
        command = probe["exec"]["command"]
        period = float(probe.get("periodSeconds", 10))
        failures = int(probe.get("failureThreshold", 3))
        limit = float(probe.get("timeoutSeconds", 1))
        deadline = time.monotonic() + timeout
        tries = 0
        last = ""
        time.sleep(float(probe.get("initialDelaySeconds", 0)))
        while time.monotonic() < deadline and tries < failures:
            if proc.poll() is not None:
                raise PodRunError(f"container {container['name']} of {pod} exited with "
                                  f"{proc.returncode} before its startup probe passed:\n"
                                  f"{log.read_text(errors='replace')[-4000:]}")
            try:
                res = podman("exec", cname, *command, check=False, timeout=limit + 30)
            except subprocess.TimeoutExpired:
                res = None
            if res is not None and res.returncode == 0:
                return
            tries += 1
            last = "" if res is None else (res.stdout + res.stderr).strip()
            time.sleep(min(period, 0.5))  # the kubelet waits periodSeconds: faster here
        raise PodRunError(f"the startup probe of {container['name']} in {pod} did not pass "
                          f"({tries} tries, last: {last!r}):\n"
                          f"{log.read_text(errors='replace')[-4000:]}")

    def stop_pods(self) -> None:
        """What the kubelet does when the pods go: the main containers first, then the
        sidecars (in reverse order), each SIGTERM then SIGKILL after the grace period."""
        pods = [p for p in self.pods if isinstance(p, ContainerPod)]
        mains = [c for p in pods for c in p.mains]
        sides = [c for p in pods for c in reversed(p.sidecars)]
        names = mains + sides
        for group in (mains, sides):
            if group:
                podman("stop", "--ignore", "-t", "30", *group, check=False, timeout=120)
        for pod in self.pods:
            for proc in [*pod.trainers, pod.sidecar]:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if names:
            podman("rm", "-f", "--ignore", "-t", "0", *names, check=False, timeout=120)
        self.pods = []

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_pods()
        if self.containers:
            podman("rm", "-f", "--ignore", "-t", "0", *self.containers, check=False,
                   timeout=120)
        for path in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


class _ImageMissing(PodRunError):
    """The image is not in podman's storage (and nothing is pulled)."""


def images_build() -> ModuleType:
    """images/build.py (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location("datalane_images_build",
                                                  ROOT / "images" / "build.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


def trainer_image(images: dict[str, str]) -> str:
    """The trainer image as a pod spec names it (a short name podman finds in its storage)."""
    assert "trainer" in images
    return f"datalane-trainer:{IMAGE_TAG}"
