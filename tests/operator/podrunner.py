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
PATH/HOME/LANG, so credentials reach the sidecar only through the Secret reference.
"""

from __future__ import annotations

import base64
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class PodRunError(AssertionError):
    pass


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

    def _env(self, pod: dict[str, Any], container: dict[str, Any], local: Any,
             ) -> dict[str, str]:
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8",
               "PYTHONPATH": str(ROOT)}
        for ref in container.get("envFrom") or []:
            if "secretRef" in ref:
                secret = self.core.read_namespaced_secret(ref["secretRef"]["name"],
                                                          self.namespace)
                env.update({k: base64.b64decode(v).decode() for k, v in secret.data.items()})
            else:
                raise PodRunError(f"envFrom {ref} is not supported by the pod runner")
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = local(e["value"])
            elif (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == (
                    "metadata.name"):
                env[e["name"]] = pod["metadata"]["name"]
            else:
                raise PodRunError(f"env {e} is not supported by the pod runner")
        return env

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
        volumes = self._volumes(pod, folder)
        (side,) = [c for c in pod["spec"].get("initContainers") or []
                   if c.get("restartPolicy") == "Always"]
        local = self._mapper(side, volumes)
        with open(folder / "sidecar.log", "wb") as log:
            proc = subprocess.Popen(_parent_death(self._argv(side, local)), cwd=ROOT,
                                    env=self._env(pod, side, local), stdout=log,
                                    stderr=subprocess.STDOUT)
        running = RunningPod(name, folder, proc)
        self.pods.append(running)
        self._probe(running, side, local, pod, probe_timeout)
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
