"""The playground's node: a long-running agent that plays kubelet for one Node and really runs
the pods the scheduler binds to it, every container in podman.

It registers the Node (no kwok annotation: nothing fakes its pods), keeps it Ready (status
heartbeat and its Lease in ``kube-node-lease``) and, every half second, looks at the pods bound
to it. Each new pod gets a :class:`PodWorker` (a thread over the e2e's container runner,
:class:`playground.containers.ContainerRunner`) that does what a kubelet with a CNI does:

* **the pod's network**: a pause container on podman's bridge network holds the pod's network
  namespace; every container of the pod joins it, and its IP is the pod's IP. So the operator's
  replicas each serve :9443 in their own namespace, and the API server reaches them at their
  EndpointSlice addresses (``--enable-aggregator-routing``; there is no kube-proxy);
* **the API server from a pod**: ``$KUBERNETES_SERVICE_HOST``/``PORT`` name the bridge's
  gateway and the API server's port (the playground's API server listens there too, its
  certificate names that IP), and the service-account volume holds a token from the
  TokenRequest API, the cluster's CA and the namespace;
* the volumes, env, security context and limits of each container, native sidecars with their
  startup probes, init containers in order (the container runner), and then the main
  containers, one each; ``hostPath`` volumes are folders of the host (created when missing);
* **status** as a kubelet reports it: phase, pod IP, the Ready/ContainersReady conditions from
  the containers' readiness probes (``tcpSocket``, ``httpGet``, ``exec``), container states
  and restart counts; a container that exits is restarted as ``restartPolicy`` says, and a pod
  whose main containers are done is ``Succeeded`` or ``Failed`` (a Job's pod, the chart's
  certificate hook);
* **deletion**: a pod marked for deletion has its main containers, then its sidecars, stopped
  (SIGTERM, then SIGKILL after the grace period) and is then removed from the API server.

Each container's output is ``<pods>/<namespace>_<pod>/<container>.log`` under the playground's
folder (``python -m playground logs POD`` prints it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

from .containers import ContainerRunner, _ImageMissing, podman
from .podrunner import ContainerConfigError, PodRunError

NODE_NAME = "playground"
GPU_RESOURCE = "nvidia.com/gpu"
LABEL = "io.datalane.playground"  # on every container (and pause container) of the agent


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _log(msg: str) -> None:
    sys.stdout.write(f"[node] {time.strftime('%H:%M:%S')} {msg}\n")
    sys.stdout.flush()


class PodWorker(ContainerRunner):
    """One pod of the node, from start to deletion (a thread)."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(agent.core, meta["namespace"])
        self.agent = agent
        self.pod = pod
        self.uid = meta["uid"]
        self.name = meta["name"]
        folder = agent.pods_dir / f"{meta['namespace']}_{meta['name']}"
        if folder.exists():  # a pod of the same name before (a recreated worker)
            folder = folder.with_name(f"{folder.name}_{self.uid[:8]}")
        self.root.rmdir()
        self.root = folder
        self.root.mkdir(parents=True)
        self.root.chmod(0o755)
        self.pause = f"dlp-{self.uid[:12]}-pause"
        self.pod_ip = ""
        self.started_at = _now()
        self.statuses: dict[str, dict[str, Any]] = {}  # container name -> its status
        self.restarts: dict[str, int] = {}
        self.procs: dict[str, Any] = {}  # container name -> the attached podman client
        self.ready: dict[str, bool] = {}
        self.phase = "Pending"
        self.deleting = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # -- the pod's world ------------------------------------------------------------------
    def _volumes(self, pod: dict[str, Any], folder: Path) -> dict[str, Path]:
        fs_group = self._pod_security(pod).get("fsGroup")
        own: dict[str, Path] = {}
        rest = []
        for vol in pod["spec"].get("volumes") or []:
            if "hostPath" in vol:
                path = Path(vol["hostPath"]["path"])
                if not path.exists():  # DirectoryOrCreate, writable by the pod's users
                    path.mkdir(parents=True)
                    path.chmod(0o777)
                own[vol["name"]] = path
            elif "projected" in vol and any("serviceAccountToken" in s
                                            for s in vol["projected"].get("sources") or []):
                local = folder / "volumes" / vol["name"]
                local.mkdir(parents=True, exist_ok=True)
                self._service_account(pod, local)
                self._own(local, fs_group, 0o755)
                own[vol["name"]] = local
            else:
                rest.append(vol)
        out = super()._volumes({**pod, "spec": {**pod["spec"], "volumes": rest}}, folder)
        return {**out, **own}

    def _service_account(self, pod: dict[str, Any], folder: Path) -> None:
        """What the kubelet projects: a bound token, the cluster's CA and the namespace."""
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {"spec": {"expirationSeconds": 86400, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid}}}
        token = self.core.create_namespaced_service_account_token(sa, self.namespace, body)
        for name, data in (("token", token.status.token), ("ca.crt", self.agent.ca_pem),
                           ("namespace", self.namespace)):
            (folder / name).write_text(data)
            (folder / name).chmod(0o644)

    def _container_env(self, pod: dict[str, Any], container: dict[str, Any],
                       ) -> dict[str, str]:
        env = super()._container_env(pod, container)
        for key, value in list(env.items()):
            if value == "127.0.0.1" and any(  # status.podIP/hostIP: this pod's address
                    (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") in (
                        "status.podIP", "status.hostIP") and e["name"] == key
                    for e in container.get("env") or []):
                env[key] = self.pod_ip
        # the kubernetes Service's variables, at an address a pod reaches (no kube-proxy)
        return {"KUBERNETES_SERVICE_HOST": self.agent.api_host,
                "KUBERNETES_SERVICE_PORT": str(self.agent.api_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.agent.api_port), **env}

    def _sandbox(self) -> None:
        """The pause container whose network namespace the pod's containers join."""
        image = (self.pod["spec"].get("containers") or [{}])[0].get("image", "")
        self._image_user(image)  # ErrImageNeverPull before anything runs
        podman("run", "-d", "--name", self.pause, "--pull=never", "--network",
               self.agent.network, "--label", f"{LABEL}={self.uid}", "--entrypoint",
               json.dumps(["sleep", "infinity"]), image, timeout=120)
        self.containers.append(self.pause)
        self.pod_ip = podman("inspect", self.pause, "--format",
                             "{{.NetworkSettings.IPAddress}}").stdout.strip()
        self.network = f"container:{self.pause}"

    # -- status ---------------------------------------------------------------------------
    def _container_status(self, c: dict[str, Any], state: dict[str, Any], ready: bool,
                          last: dict[str, Any] | None = None) -> None:
        row = {"name": c["name"], "image": c.get("image", ""), "imageID": "",
               "containerID": f"podman://{self._cname(c)}", "ready": ready,
               "started": "running" in state, "restartCount": self.restarts.get(c["name"], 0),
               "state": state}
        if last:
            row["lastState"] = last
        self.statuses[c["name"]] = row

    def _publish(self) -> None:
        spec = self.pod["spec"]
        inits = [self.statuses[c["name"]] for c in spec.get("initContainers") or []
                 if c["name"] in self.statuses]
        mains = [self.statuses[c["name"]] for c in spec["containers"]
                 if c["name"] in self.statuses]
        ready = bool(mains) and len(mains) == len(spec["containers"]) and all(
            r["ready"] for r in mains + [s for s in inits if s["started"]])
        initialized = all(c["name"] in self.statuses and (
            c.get("restartPolicy") == "Always" or "terminated" in self.statuses[c["name"]][
                "state"]) for c in spec.get("initContainers") or [])
        now = _now()

        def cond(kind: str, ok: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False",
                    "lastProbeTime": None, "lastTransitionTime": now}
        for _ in range(5):
            from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

            try:
                raw = self.core.read_namespaced_pod(self.name, self.namespace,
                                                    _preload_content=False)
                pod = json.loads(raw.data)
                if pod["metadata"]["uid"] != self.uid:
                    return
                st = pod.setdefault("status", {})
                old = {c["type"]: c for c in st.get("conditions") or []}
                conds = []
                for kind, ok in (("PodReadyToStartContainers", bool(self.pod_ip)),
                                 ("Initialized", initialized), ("Ready", ready),
                                 ("ContainersReady", ready), ("PodScheduled", True)):
                    c = cond(kind, ok)
                    if kind in old and old[kind].get("status") == c["status"]:
                        c["lastTransitionTime"] = old[kind].get("lastTransitionTime", now)
                    conds.append(c)
                st.update(phase=self.phase, conditions=conds, hostIP=self.agent.api_host,
                          hostIPs=[{"ip": self.agent.api_host}], startTime=self.started_at)
                if self.pod_ip:
                    st.update(podIP=self.pod_ip, podIPs=[{"ip": self.pod_ip}])
                st["initContainerStatuses"] = inits
                st["containerStatuses"] = mains
                self.core.replace_namespaced_pod_status(self.name, self.namespace, pod)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                if e.status != 409:
                    raise
                time.sleep(0.2)

    # -- running --------------------------------------------------------------------------
    def _cname(self, c: dict[str, Any]) -> str:
        return f"dlp-{self.uid[:12]}-{c['name']}-{self.restarts.get(c['name'], 0)}"

    def _start_container(self, c: dict[str, Any], volumes: dict[str, Path]) -> Any:
        env = self._container_env(self.pod, c)
        self._security_args(self.pod, c)  # config errors before anything runs
        name = self._cname(c)
        podman("rm", "-f", "--ignore", "-t", "0", name, check=False)
        log = self.root / f"{c['name']}.log"
        proc = self._launch(self.pod, c, name, volumes, env, self.root, log)
        self.procs[c["name"]] = proc
        self._container_status(c, {"running": {"startedAt": _now()}},
                               ready=c.get("readinessProbe") is None
                               and c.get("startupProbe") is None)
        return proc

    def _run(self) -> None:
        try:
            self._start()
            self._supervise()
        except Exception as e:  # the pod stays as the error left it; the node goes on
            if not self.deleting.is_set():
                _log(f"pod {self.namespace}/{self.name}: {e}\n{traceback.format_exc()}")
        finally:
            self.done.set()

    def _start(self) -> None:
        spec = self.pod["spec"]
        inits = spec.get("initContainers") or []
        try:
            self._sandbox()
            volumes = self._volumes(self.pod, self.root)
            self.volumes = volumes
            self.phase = "Running" if not inits else "Pending"
            self._publish()
            for c in inits:
                if self.deleting.is_set():
                    return
                proc = self._start_container(c, volumes)
                self._publish()
                if c.get("restartPolicy") == "Always":  # a native sidecar
                    self._probe_container(self.name, self._cname(c), c, proc,
                                          self.root / f"{c['name']}.log", 300)
                    self.statuses[c["name"]]["ready"] = True
                    self.statuses[c["name"]]["started"] = True
                else:
                    code = proc.wait()
                    self._container_status(c, {"terminated": {
                        "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                        "finishedAt": _now()}}, ready=False)
                    if code != 0:
                        self.phase = "Failed"
                        self._publish()
                        return
            self.phase = "Running"
            for c in spec["containers"]:
                self._start_container(c, volumes)
            self._publish()
        except (ContainerConfigError, _ImageMissing) as e:
            reason = ("ErrImageNeverPull" if isinstance(e, _ImageMissing)
                      else "CreateContainerConfigError")
            for c in [*inits, *spec["containers"]]:
                if c["name"] not in self.statuses:
                    self._container_status(c, {"waiting": {"reason": reason,
                                                           "message": str(e)}}, ready=False)
            self._publish()
            raise

    def _ready(self, c: dict[str, Any], kind: str) -> bool:
        probe = c.get(kind)
        if probe is None:
            return True
        try:
            if "tcpSocket" in probe:
                port = self._port(c, probe["tcpSocket"]["port"])
                with socket.create_connection((self.pod_ip, port), timeout=2):
                    return True
            if "httpGet" in probe:
                get = probe["httpGet"]
                url = f"http://{self.pod_ip}:{self._port(c, get['port'])}{get.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(200 <= r.status < 400)
            if "exec" in probe:
                return podman("exec", self._cname(c), *probe["exec"]["command"], check=False,
                              timeout=30).returncode == 0
        except (OSError, PodRunError):
            return False
        return True

    @staticmethod
    def _port(c: dict[str, Any], port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return int(next(p["containerPort"] for p in c.get("ports") or []
                        if p.get("name") == port))

    def _supervise(self) -> None:
        """Readiness, restarts and the end of the pod, until it is deleted."""
        spec = self.pod["spec"]
        policy = spec.get("restartPolicy", "Always")
        while not self.deleting.is_set() and self.phase == "Running":
            changed = False
            for c in [*(c for c in spec.get("initContainers") or []
                        if c.get("restartPolicy") == "Always"), *spec["containers"]]:
                proc = self.procs.get(c["name"])
                row = self.statuses.get(c["name"])
                if proc is None or row is None or "running" not in row["state"]:
                    continue
                code = proc.poll()
                if code is None:
                    ready = self._ready(c, "readinessProbe")
                    if ready != row["ready"]:
                        row["ready"] = ready
                        changed = True
                    continue
                if self.deleting.is_set():
                    break
                changed = True
                term = {"terminated": {"exitCode": code, "finishedAt": _now(),
                                       "reason": "Completed" if code == 0 else "Error"}}
                sidecar = c.get("restartPolicy") == "Always"
                if sidecar or policy == "Always" or (policy == "OnFailure" and code != 0):
                    _log(f"pod {self.namespace}/{self.name}: container {c['name']} exited "
                         f"with {code}; restarting it")
                    self.restarts[c["name"]] = self.restarts.get(c["name"], 0) + 1
                    time.sleep(2)  # the kubelet's back-off, short
                    self._start_container(c, self.volumes)
                    self.statuses[c["name"]]["lastState"] = term
                else:
                    self._container_status(c, term, ready=False)
            mains = [self.statuses[c["name"]] for c in spec["containers"]]
            if all("terminated" in r["state"] for r in mains):
                self._stop_all(grace=10)
                codes = [r["state"]["terminated"]["exitCode"] for r in mains]
                self.phase = "Succeeded" if not any(codes) else "Failed"
                changed = True
            if changed:
                self._publish()
            self.deleting.wait(1.0)

    def _stop_all(self, grace: int) -> None:
        """Main containers first, then the sidecars in reverse order (SIGTERM, then SIGKILL
        after ``grace`` seconds), then the pause container."""
        spec = self.pod["spec"]
        sides = [c for c in reversed(spec.get("initContainers") or [])
                 if c.get("restartPolicy") == "Always"]
        for group in (spec["containers"], sides):
            names = [self._cname(c) for c in group if c["name"] in self.procs]
            if names:
                podman("stop", "--ignore", "-t", str(grace), *names, check=False,
                       timeout=grace + 60)
            for c in group:
                proc = self.procs.get(c["name"])
                if proc is not None:
                    with contextlib.suppress(Exception):
                        proc.wait(timeout=10)

    def terminate(self) -> None:
        """The pod is being deleted: stop it and remove it from the API server."""
        from kubernetes.client.rest import ApiException

        self.deleting.set()
        grace = int(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        self.thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._stop_all(grace=min(grace, 30))
        self.close()
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(self.name, self.namespace, body={
                "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})

    def close(self) -> None:
        names = [n for n in self.containers if n != self.pause]
        if names:
            podman("rm", "-f", "--ignore", "-t", "0", *names, check=False, timeout=120)
        podman("rm", "-f", "--ignore", "-t", "0", self.pause, check=False, timeout=120)
        for path in reversed(self.mounts):
            import subprocess

            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


class NodeAgent:
    """The Node ``playground`` and the pods bound to it (see the module docstring)."""

    def __init__(self, api: Any, folder: Path, api_host: str, api_port: int, ca_pem: bytes,
                 network: str = "podman", name: str = NODE_NAME, gpus: int = 8) -> None:
        from kubernetes import client  # type: ignore[import-untyped]

        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.pods_dir = folder / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.api_host, self.api_port = api_host, api_port
        self.ca_pem = ca_pem.decode()
        self.network = network
        self.name = name
        self.gpus = gpus
        self.workers: dict[str, PodWorker] = {}
        self.stopping = threading.Event()
        self._beat = 0.0

    def register(self) -> None:
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi",
                    GPU_RESOURCE: str(self.gpus)}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": {
                    "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true"}},
                "spec": {}}
        self.core.create_node(node)
        self._heartbeat(capacity)

    def _heartbeat(self, capacity: dict[str, str] | None = None) -> None:
        now = _now()
        status: dict[str, Any] = {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the playground's node agent is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": self.api_host},
                          {"type": "Hostname", "address": self.name}],
            "nodeInfo": {"kubeletVersion": "playground", "containerRuntimeVersion": "podman",
                         "operatingSystem": "linux", "architecture": "amd64",
                         "machineID": "", "systemUUID": "", "bootID": "",
                         "kernelVersion": "", "osImage": "", "kubeProxyVersion": ""}}
        if capacity:
            status.update(capacity=capacity, allocatable=capacity)
        self.core.patch_node_status(self.name, {"status": status})
        meta: dict[str, Any] = {"name": self.name, "namespace": "kube-node-lease"}
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40,
                "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        from kubernetes.client.rest import ApiException

        try:
            version = self.coordination.read_namespaced_lease(
                self.name, "kube-node-lease").metadata.resource_version
            self.coordination.replace_namespaced_lease(self.name, "kube-node-lease", {
                "metadata": {**meta, "resourceVersion": version}, "spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease",
                                                      {"metadata": meta, "spec": spec})
        self._beat = time.monotonic()

    def sync(self) -> None:
        raw = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}",
                                                    _preload_content=False)
        seen = set()
        for pod in json.loads(raw.data)["items"]:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            worker = self.workers.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if worker is not None and not worker.deleting.is_set():
                    _log(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}: "
                         f"deleted; stopping it")
                    threading.Thread(target=worker.terminate, daemon=True).start()
                elif worker is None:
                    self.core.delete_namespaced_pod(  # (a body's options are the ones used)
                        pod["metadata"]["name"], pod["metadata"]["namespace"],
                        body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
                continue
            if worker is None and pod.get("status", {}).get("phase") in (None, "Pending"):
                _log(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}: starting")
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.thread.start()
        for uid in set(self.workers) - seen:  # gone without us (force-deleted)
            worker = self.workers.pop(uid)
            if not worker.deleting.is_set():
                worker.deleting.set()
                threading.Thread(target=worker.close, daemon=True).start()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if time.monotonic() - self._beat > 10:
                    self._heartbeat()
                self.sync()
            except Exception as e:  # the API server restarting, a transient error
                _log(f"sync failed: {e!r}")
            self.stopping.wait(0.5)

    def stop(self) -> None:
        """Stop every pod (together, as a node's shutdown does) and remove its containers."""
        self.stopping.set()

        def end(worker: PodWorker) -> None:
            worker.deleting.set()
            with contextlib.suppress(Exception):
                worker._stop_all(grace=10)
            with contextlib.suppress(Exception):
                worker.close()
        threads = [threading.Thread(target=end, args=(w,)) for w in self.workers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
