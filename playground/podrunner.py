"""Plays kubelet for the training pods that kwok marks Running.

kwok fakes a node's status but runs no container. For the end-to-end test the datalane
containers of each pod must really run, from the pod spec **as the API server stored it**
(after the operator's mutation): :class:`PodRunner` starts the native sidecar (the init
container with ``restartPolicy: Always``) with its env, ``envFrom`` Secret and
``fieldRef``; mounts its volumes as local folders (``emptyDir``, ``configMap`` from the
cluster's ConfigMap); runs the startup probe's exec command until it succeeds; then starts
the trainer container's command with its env, the way torchrun would in that pod (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` from the training-operator's ``PET_*`` env and the replica
index). Paths under a mount are rewritten to the local folder; ``python`` and console
scripts resolve in this virtualenv. The process environment starts empty apart from
PATH/HOME/LANG, so credentials reach the sidecar only through the Secret references
(``envFrom``, ``secretKeyRef``, ``$(VAR)`` references expanded as the kubelet does, and
``secret`` volumes).

Like a kubelet it reports what it cannot start in the pod status: a container whose
``envFrom`` or ``secretKeyRef`` Secret is missing waits in ``CreateContainerConfigError``
(``secret "x" not found``); a sidecar that exits before its startup probe passes is reported
with ``lastState.terminated`` (exit code, ``reason: Error``, and the **termination message**:
the file at its ``terminationMessagePath``, which the runner provides as
``$DATALANE_TERMINATION_LOG`` since it cannot mount ``/dev/termination-log``, or with
``FallbackToLogsOnError`` the log's last 80 lines / 2048 bytes) and waits in
``CrashLoopBackOff``. The pod stays ``Running`` with ``Ready`` false: kwok's pod-ready stage
would rewrite a ``Pending`` pod as ready.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class PodRunError(AssertionError):
    pass


class ContainerConfigError(PodRunError):
    """What the kubelet calls CreateContainerConfigError: the container is never started."""


TERMINATION_LOG_ENV = "DATALANE_TERMINATION_LOG"
_FALLBACK_LINES, _FALLBACK_BYTES = 80, 2048  # the kubelet's FallbackToLogsOnError tail
_MAX_MESSAGE = 4096
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


def secret_key(secret_of: Any, namespace: str, ref: dict[str, Any]) -> str | None:
    """The value an env ``secretKeyRef`` names, as the kubelet resolves it: None for a missing
    optional one, ContainerConfigError (the kubelet's CreateContainerConfigError) otherwise."""
    secret = secret_of(ref["name"])
    if secret is None or ref["key"] not in secret:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(
            f'secret "{ref["name"]}" not found' if secret is None else
            f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
    return str(secret[ref["key"]].decode())


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of an env value: a defined variable is replaced,
    ``$$`` is a literal ``$``, an undefined reference stays as it is."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR_REF.sub(sub, value)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunningPod:
    name: str
    folder: Path
    sidecar: subprocess.Popen[bytes]
    trainers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)

    def logs(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.folder.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {self.name}/{path.name}\n" + "\n".join(text))
        return "\n".join(out)


def _parent_death(args: list[str]) -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args


class PodRunner:
    """Run the datalane sidecar and the trainer of pods, as local processes."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core = core  # kubernetes.client.CoreV1Api (admin)
        self.namespace = namespace
        self.root = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))  # short: socket paths
        self.pods: list[RunningPod] = []
        self.started = 0

    # -- the pod's world ------------------------------------------------------------------
    def _volumes(self, pod: dict[str, Any], folder: Path) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for vol in pod["spec"].get("volumes") or []:
            local = folder / vol["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                cm = self.core.read_namespaced_config_map(vol["configMap"]["name"],
                                                          self.namespace)
                items = vol["configMap"].get("items") or [{"key": k, "path": k}
                                                          for k in cm.data]
                for item in items:
                    (local / item["path"]).write_text(cm.data[item["key"]])
            elif "secret" in vol:
                name = vol["secret"]["secretName"]
                secret = self._secret(name)
                if secret is None:
                    raise ContainerConfigError(f'secret "{name}" not found')
                for key, value in secret.items():
                    path = local / key
                    path.write_bytes(value)
                    path.chmod(vol["secret"].get("defaultMode", 0o644))
            elif "emptyDir" not in vol and "projected" not in vol:  # projected: the SA token
                raise PodRunError(f"volume {vol['name']} of {pod['metadata']['name']} is not an "
                                  f"emptyDir or configMap; the pod runner cannot mount it")
            out[vol["name"]] = local
        return out

    @staticmethod
    def _mapper(container: dict[str, Any], volumes: dict[str, Path]) -> Any:
        mounts = sorted(((m["mountPath"].rstrip("/"), volumes[m["name"]])
                         for m in container.get("volumeMounts") or []),
                        key=lambda m: -len(m[0]))

        def local(value: str) -> str:
            for path, folder in mounts:
                if value == path or value.startswith(path + "/"):
                    return str(folder) + value[len(path):]
            return value
        return local

    def _secret(self, name: str) -> dict[str, bytes] | None:
        from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def _env(self, pod: dict[str, Any], container: dict[str, Any], local: Any,
             folder: Path | None = None) -> dict[str, str]:
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8",
               "PYTHONPATH": str(ROOT)}
        for ref in container.get("envFrom") or []:
            if "secretRef" in ref:
                secret = self._secret(ref["secretRef"]["name"])
                if secret is None and not ref["secretRef"].get("optional"):
                    raise ContainerConfigError(f'secret "{ref["secretRef"]["name"]}" not found')
                env.update({k: v.decode() for k, v in (secret or {}).items()})
            else:
                raise PodRunError(f"envFrom {ref} is not supported by the pod runner")
        for e in container.get("env") or []:
            source = e.get("valueFrom") or {}
            if "value" in e:
                env[e["name"]] = local(expand(e["value"], env))
            elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = pod["metadata"]["name"]
            elif "secretKeyRef" in source:
                value = secret_key(self._secret, self.namespace, source["secretKeyRef"])
                if value is not None:
                    env[e["name"]] = value
            elif not source:  # an empty value: the API server drops "value: ''", as
                env[e["name"]] = ""  # the kubelet then gives the variable as empty
            else:
                raise PodRunError(f"env {e} is not supported by the pod runner")
        if folder is not None and container.get("terminationMessagePath"):
            # the kubelet mounts a file at terminationMessagePath; here it is this one
            env[TERMINATION_LOG_ENV] = str(folder / f"{container['name']}.termination-log")
        return env

    # -- the status a kubelet reports -------------------------------------------------------
    def _set_container_status(self, name: str, container: str, status: dict[str, Any],
                              ready: bool = False) -> None:
        """Replace one container's status (init or not) in the pod's status, and the pod's
        Ready/ContainersReady conditions, as a kubelet's status manager does."""
        body = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        pod = json.loads(body.data)
        st = pod.setdefault("status", {})
        for key in ("initContainerStatuses", "containerStatuses"):
            rows = st.get(key) or []
            if any(r.get("name") == container for r in rows):
                st[key] = [status if r.get("name") == container else r for r in rows]
                break
        else:
            st.setdefault("initContainerStatuses", []).append(status)
        flag = "True" if ready else "False"
        for cond in st.get("conditions") or []:
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != flag:
                cond.update(status=flag, lastTransitionTime=_now(),
                            reason=None if ready else "ContainersNotReady",
                            message=None if ready else f"containers with unready status: "
                                                       f"[{container}]")
        self.core.replace_namespaced_pod_status(name, self.namespace, pod)

    def report_config_error(self, pod: dict[str, Any], container: dict[str, Any],
                            message: str) -> None:
        self._set_container_status(pod["metadata"]["name"], container["name"], {
            "name": container["name"], "image": container.get("image", ""), "imageID": "",
            "ready": False, "started": False, "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError",
                                  "message": message}}})

    def report_exit(self, pod: dict[str, Any], container: dict[str, Any], folder: Path,
                    code: int, started: str) -> str:
        """Report that ``container`` exited with ``code``; returns the termination message."""
        path = folder / f"{container['name']}.termination-log"
        message = path.read_bytes()[:_MAX_MESSAGE].decode("utf-8", "replace") if (
            path.exists()) else ""
        if (not message.strip() and code != 0
                and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"):
            log = (folder / "sidecar.log").read_bytes()
            tail = b"\n".join(log.splitlines()[-_FALLBACK_LINES:])[-_FALLBACK_BYTES:]
            message = tail.decode("utf-8", "replace")
        name = pod["metadata"]["name"]
        self._set_container_status(name, container["name"], {
            "name": container["name"], "image": container.get("image", ""), "imageID": "",
            "ready": False, "started": False, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": f"back-off 10s restarting failed container="
                                             f"{container['name']} pod={name}"}},
            "lastState": {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "message": message, "startedAt": started, "finishedAt": _now()}}})
        return message

    @staticmethod
    def _argv(container: dict[str, Any], local: Any) -> list[str]:
        argv = [local(a) for a in (container.get("command") or []) + (container.get("args")
                                                                     or [])]
        if not argv:
            raise PodRunError(f"container {container['name']} has no command")
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        elif (BIN / argv[0]).exists():
            argv[0] = str(BIN / argv[0])
        return argv

    # -- running ---------------------------------------------------------------------------
    def start(self, pod: dict[str, Any], extra_env: dict[str, str] | None = None,
              trainer: str = "pytorch", probe_timeout: float = 120.0) -> RunningPod:
        name = pod["metadata"]["name"]
        self.started += 1
        folder = self.root / f"{self.started}"  # short: the socket path must fit 107 bytes
        folder.mkdir(parents=True)
        (side,) = [c for c in pod["spec"].get("initContainers") or []
                   if c.get("restartPolicy") == "Always"]
        try:
            volumes = self._volumes(pod, folder)
            local = self._mapper(side, volumes)
            env = self._env(pod, side, local, folder)
        except ContainerConfigError as e:
            self.report_config_error(pod, side, str(e))
            raise
        started = _now()
        with open(folder / "sidecar.log", "wb") as log:
            proc = subprocess.Popen(_parent_death(self._argv(side, local)), cwd=ROOT,
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
        running = RunningPod(name, folder, proc)
        self.pods.append(running)
        try:
            self._probe(running, side, local, pod, probe_timeout)
        except PodRunError:
            if running.sidecar.poll() is not None:
                self.report_exit(pod, side, folder, running.sidecar.returncode, started)
            raise
        (main,) = [c for c in pod["spec"]["containers"] if c["name"] == trainer]
        tlocal = self._mapper(main, volumes)
        env = self._env(pod, main, tlocal)
        nproc, nnodes = int(env["PET_NPROC_PER_NODE"]), int(env["PET_NNODES"])
        node = int(pod["metadata"]["labels"]["training.kubeflow.org/replica-index"])
        for local_rank in range(nproc):  # what torchrun does in this pod
            renv = {**env, **(extra_env or {}), "LOCAL_RANK": str(local_rank),
                    "RANK": str(node * nproc + local_rank), "WORLD_SIZE": str(nnodes * nproc)}
            out = folder / f"trainer-{local_rank}.log"
            with open(out, "wb") as f:
                running.trainers.append(subprocess.Popen(
                    _parent_death(self._argv(main, tlocal)), cwd=ROOT, env=renv, stdout=f,
                    stderr=subprocess.STDOUT))
            running.outputs.append(out)
        return running

    def _probe(self, running: RunningPod, side: dict[str, Any], local: Any,
               pod: dict[str, Any], timeout: float) -> None:
        probe = side["startupProbe"]["exec"]["command"]
        env = self._env(pod, side, local)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if running.sidecar.poll() is not None:
                raise PodRunError(f"the sidecar of {running.name} exited with "
                                  f"{running.sidecar.returncode}:\n{running.logs()}")
            if subprocess.run(self._argv({"name": "probe", "command": probe}, local), env=env,
                              capture_output=True, check=False, timeout=30).returncode == 0:
                return
            time.sleep(0.3)
        raise PodRunError(f"the startup probe of {running.name} did not pass in {timeout:.0f} "
                          f"s:\n{running.logs()}")

    def wait_trainers(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        for pod in self.pods:
            for proc in pod.trainers:
                left = max(1.0, deadline - time.monotonic())
                try:
                    rc = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    raise PodRunError(f"a trainer of {pod.name} still runs after "
                                      f"{timeout:.0f} s:\n{self.logs()}") from None
                if rc != 0:
                    raise PodRunError(f"a trainer of {pod.name} exited with {rc}:\n"
                                      f"{self.logs()}")

    def stop_pods(self) -> None:
        """What kubelet does when the pods go: SIGTERM, then SIGKILL after a grace period."""
        for pod in self.pods:
            for proc in [*pod.trainers, pod.sidecar]:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        for pod in self.pods:
            for proc in [*pod.trainers, pod.sidecar]:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.pods = []

    def logs(self) -> str:
        return "\n".join(p.logs() for p in self.pods)

    def close(self) -> None:
        self.stop_pods()
        shutil.rmtree(self.root, ignore_errors=True)


RUNTIMES = ("processes", "containers")


def make_runner(core: Any, namespace: str, runtime: str = "processes") -> PodRunner:
    """The pod runner of ``runtime``: local processes (:class:`PodRunner`), or every container
    of the pod in podman (:class:`playground.containers.ContainerRunner`)."""
    if runtime == "containers":
        from .containers import ContainerRunner

        return ContainerRunner(core, namespace)
    if runtime != "processes":
        raise PodRunError(f"pod runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    return PodRunner(core, namespace)
