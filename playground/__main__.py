"""``make playground``: a local cluster that the README's "On a cluster" section runs against.

    python -m playground up      # start it (or find it running); prints the KUBECONFIG line
    python -m playground up --trainer-v2   # ... with Kubeflow Trainer v2 and JobSet too
    python -m playground down    # stop everything it started, remove its folder
    python -m playground logs POD [CONTAINER] [-n NAMESPACE]   # a container's output

``up`` starts ``serve`` as a detached process and waits until it writes ``state.json``
(ready). ``serve`` runs, in the playground's folder (``$DATALANE_PLAYGROUND_DIR``, default
``/tmp/datalane-playground``):

* the images of the working tree (images/build.py: cached in podman's storage by a hash of
  their inputs, built when missing), tagged with the names the chart and examples/pretrain.yaml
  use (what ``kind load`` does for kind: the images are on the node, nothing is pulled);
* the control plane of the tests (playground/cluster.py: etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler) without kwok, and Kubeflow's training-operator;
  with ``--trainer-v2`` also Kubeflow Trainer v2's and JobSet's controllers
  (playground/trainerv2.py: TrainJobs);
* an S3 server (moto) on port 30900 of the host with the demo corpus in ``s3://playground``;
* the node agent (playground/node.py): the Node ``playground`` whose pods really run, every
  container in podman.

The datalane operator is not started here: ``helm install`` (the README) runs it in the
cluster from the chart, as on any cluster. ``down`` (``make playground-down``) sends
``serve`` SIGTERM (it stops the pods, the S3 server and the control plane), removes what a
killed ``serve`` left (containers, tmpfs mounts) and the folder. docs/playground.md says why
it is built this way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .containers import _alive

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("DATALANE_PLAYGROUND_DIR") or "/tmp/datalane-playground")
S3_PORT = 30900
S3_KEYS = ("playground", "playground-secret")  # the Secret of examples/pretrain.yaml
BUCKET = "playground"
TRAINER_IMAGE = "localhost/datalane-trainer:0.1.0"  # examples/pretrain.yaml's trainer


def _out(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def _log(msg: str) -> None:
    _out(f"[playground] {time.strftime('%H:%M:%S')} {msg}")


def read_state(folder: Path = FOLDER) -> dict[str, Any] | None:
    """The running playground's state (pid, kubeconfig, ...), or None."""
    path = folder / "state.json"
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state if _alive(int(state["pid"])) else None


def export_line(folder: Path = FOLDER) -> str:
    return f"export KUBECONFIG={folder / 'kubeconfig'}"


# -- serve (the detached process) -------------------------------------------------------------
def chart_images() -> dict[str, str]:
    """image folder -> the name the chart (operator, sidecar) and the example (trainer) use."""
    chart = yaml.safe_load((ROOT / "helm/datalane/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm/datalane/values.yaml").read_text())
    image = values["image"]
    return {"operator": f"{image['repository']}:{image['tag'] or chart['appVersion']}",
            "sidecar": values["sidecar"]["image"], "trainer": TRAINER_IMAGE}


def load_images() -> dict[str, str]:
    from .containers import images_build, podman

    build = images_build()
    refs: dict[str, str] = build.ensure()
    names = chart_images()
    for folder, ref in refs.items():
        podman("tag", ref, names[folder])
    return names


def bridge_gateway(network: str) -> str:
    from .containers import podman

    out = podman("network", "inspect", network, "--format",
                 "{{range .Subnets}}{{.Gateway}} {{end}}").stdout.split()
    if not out:
        raise RuntimeError(f"podman network {network} has no gateway")
    return out[0]


def start_s3(folder: Path) -> subprocess.Popen[bytes]:
    """moto's S3 server on the host's port 30900 (every pod reaches it at the bridge's
    gateway, ``host.containers.internal``), with the demo corpus uploaded."""
    import s3fs

    from datalane.corpus import make_corpus

    env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEYS[0], "AWS_SECRET_ACCESS_KEY": S3_KEYS[1],
           "AWS_DEFAULT_REGION": "us-east-1",
           # the name pods use: an endpoint, not a virtual-hosted bucket "host"
           "MOTO_S3_CUSTOM_ENDPOINTS": f"http://host.containers.internal:{S3_PORT}"}
    setpriv = shutil.which("setpriv")
    with open(folder / "s3.log", "ab") as log:
        proc = subprocess.Popen(
            [*([setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []), sys.executable,
             "-m", "moto.server", "-H", "0.0.0.0", "-p", str(S3_PORT)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{S3_PORT}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the S3 server exited with {proc.returncode} (port {S3_PORT} "
                               f"taken?): {(folder / 's3.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(endpoint + "/", timeout=2).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the S3 server did not answer on {endpoint}") from None
            time.sleep(0.2)
    corpus = make_corpus(str(folder / "corpus"), web_docs=600)
    fs = s3fs.S3FileSystem(key=S3_KEYS[0], secret=S3_KEYS[1],
                           client_kwargs={"endpoint_url": endpoint})
    fs.mkdir(BUCKET)
    fs.put(corpus.root.rstrip("/") + "/", f"{BUCKET}/corpus/", recursive=True)
    return proc


def serve(folder: Path, trainer_v2: bool = False) -> int:
    """Start everything, write state.json, run the node agent until SIGTERM."""
    from .cluster import Cluster, ClusterOptions
    from .node import NodeAgent
    from .trainerv2 import start_trainer_v2

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    network = "podman"
    cluster: Cluster | None = None
    s3: subprocess.Popen[bytes] | None = None
    agent: NodeAgent | None = None
    try:
        _log("images: building what is missing (images/build.py)")
        images = load_images()
        _log(f"images ready in {time.monotonic() - t0:.1f} s: {', '.join(images.values())}")
        gateway = bridge_gateway(network)
        cluster = Cluster(ClusterOptions(
            kwok=False, nodes=[], workdir=folder / "cluster", bind_address="0.0.0.0",
            extra_ips=[gateway], aggregator_routing=True))
        cluster.start()
        cluster.start_training_operator()
        _log(f"control plane and training-operator ready at {time.monotonic() - t0:.1f} s")
        if trainer_v2:
            start_trainer_v2(cluster)
            _log(f"Trainer v2 and JobSet ready at {time.monotonic() - t0:.1f} s")
        s3 = start_s3(folder)
        _log(f"S3 server on :{S3_PORT} with the corpus at {time.monotonic() - t0:.1f} s")
        agent = NodeAgent(cluster.api_client(), folder, gateway, cluster.apiserver_port,
                          cluster.ca_pem, network=network)
        agent.register()
        runner = threading.Thread(target=agent.run, name="node", daemon=True)
        runner.start()
        cluster.wait_for("node playground Ready", lambda: '"True"' in cluster.kubectl(
            "get", "node", "playground", "-o",
            'jsonpath="{.status.conditions[?(@.type=="Ready")].status}"').stdout)
        shutil.copy(cluster.kubeconfig, folder / "kubeconfig")
        (folder / "bin").symlink_to(cluster.bin_dir)
        state = {"pid": os.getpid(), "kubeconfig": str(folder / "kubeconfig"),
                 "bin": str(cluster.bin_dir), "server": cluster.server,
                 "s3": f"http://127.0.0.1:{S3_PORT}", "trainer_v2": trainer_v2,
                 "started_s": round(time.monotonic() - t0, 1)}
        (folder / "state.json.part").write_text(json.dumps(state, indent=1))
        (folder / "state.json.part").rename(folder / "state.json")
        _log(f"ready in {time.monotonic() - t0:.1f} s")
        while not stop.is_set():
            if not runner.is_alive():
                raise RuntimeError("the node agent stopped")
            cluster.check_alive()
            stop.wait(1.0)
        return 0
    except BaseException as e:
        _log(f"failed: {e!r}")
        if cluster is not None and cluster.workdir is not None:
            _log(cluster.diagnostics(lines=20))
        return 1
    finally:
        _log("stopping")
        if agent is not None:
            agent.stop()
        if s3 is not None:
            s3.terminate()
        if cluster is not None:
            cluster.stop(keep_workdir=True)  # `down` removes the folder


# -- up, down, logs ---------------------------------------------------------------------------
def up(folder: Path, timeout: float = 3600, trainer_v2: bool = False) -> int:
    state = read_state(folder)
    if state is not None:
        if trainer_v2 and not state.get("trainer_v2"):
            _out(f"the playground runs (pid {state['pid']}) without Trainer v2: "
                 "`make playground-down` first, then up --trainer-v2", err=True)
            return 1
        _out(f"the playground runs (pid {state['pid']}); to use it:\n{export_line(folder)}")
        return 0
    if folder.exists():
        down(folder, quiet=True)
    folder.mkdir(parents=True)
    t0 = time.monotonic()
    log = folder / "playground.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "sidecar"), str(ROOT / "operator"),
         os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with open(log, "ab") as f:
        serve_args = ["serve", *(["--trainer-v2"] if trainer_v2 else [])]
        proc = subprocess.Popen([sys.executable, "-m", "playground", *serve_args], cwd=ROOT,
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    (folder / "serve.pid").write_text(str(proc.pid))
    _out(f"[playground] starting (log: {log}) ...")
    shown = 0
    while not (folder / "state.json").exists():
        text = log.read_text(errors="replace")
        for line in text[shown:].splitlines(keepends=True):  # serve's progress, as it goes
            if line.endswith("\n") and line.startswith(("[playground]", "[images]")):
                _out("  " + line.rstrip())
            if line.endswith("\n"):
                shown += len(line)
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            _out(log.read_text(errors="replace")[-6000:], err=True)
            _out("[playground] FAILED to start (the log above); `make playground-down` "
                 "cleans up", err=True)
            return 1
        time.sleep(0.5)
    extra = ", Trainer v2 and JobSet" if trainer_v2 else ""
    _out(f"[playground] ready in {time.monotonic() - t0:.1f} s: the API server, the "
         f"training-operator{extra}, an S3 server and the node 'playground' (pods run in "
         f"podman). "
         f"The README's 'On a cluster' commands run against it:\n{export_line(folder)}")
    return 0


def down(folder: Path, quiet: bool = False) -> int:
    from .containers import LABEL as RUNNER_LABEL
    from .containers import podman

    path = folder / "serve.pid"  # written by `up` when it starts `serve`
    pid = int(path.read_text()) if path.exists() else None
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 90
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    # what a killed agent left: its pods' containers (labelled with its pid) and pause ones
    from .node import LABEL

    for label in ([LABEL] + ([f"{RUNNER_LABEL}={pid}"] if pid is not None else [])):
        ids = podman("ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
        if ids:
            podman("rm", "-f", "-t", "0", *ids, check=False, timeout=120)
    with open("/proc/mounts") as f:
        mounts = [ln.split()[1] for ln in f if ln.split()[1].startswith(str(folder) + "/")]
    for mount in sorted(mounts, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)
    if not quiet:
        _out(f"[playground] stopped{f' (pid {pid})' if pid else ''}; removed {folder}")
    return 0


def logs(folder: Path, pod: str, container: str, namespace: str) -> int:
    base = folder / "pods"
    runs = sorted(base.glob(f"{namespace}_{pod}*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        _out(f"no pod {namespace}/{pod} ran on the playground's node", err=True)
        return 1
    log = runs[-1] / f"{container}.log"
    if not log.exists():
        have = ", ".join(sorted(p.stem for p in runs[-1].glob("*.log")))
        _out(f"pod {namespace}/{pod} has no container {container} (it has {have})", err=True)
        return 1
    sys.stdout.write(log.read_text(errors="replace"))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m playground", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    trainer_v2 = argparse.ArgumentParser(add_help=False)
    trainer_v2.add_argument(
        "--trainer-v2", action="store_true",
        help="also run Kubeflow Trainer v2's and JobSet's controllers (TrainJobs; built by "
             "DATALANE_CLUSTER_TRAINER_V2=1 bash tests/cluster/build.sh)")
    sub.add_parser("up", help="start the playground (or find it running)", parents=[trainer_v2])
    sub.add_parser("down", help="stop it and remove its folder")
    sub.add_parser("serve", help="(what `up` runs, detached)", parents=[trainer_v2])
    lg = sub.add_parser("logs", help="a container's output")
    lg.add_argument("pod")
    lg.add_argument("container", nargs="?", default="pytorch")
    lg.add_argument("-n", "--namespace", default="default")
    args = p.parse_args(argv)
    if args.cmd == "up":
        return up(FOLDER, trainer_v2=args.trainer_v2)
    if args.cmd == "down":
        return down(FOLDER)
    if args.cmd == "serve":
        return serve(FOLDER, trainer_v2=args.trainer_v2)
    return logs(FOLDER, args.pod, args.container, args.namespace)


if __name__ == "__main__":
    sys.exit(main())
