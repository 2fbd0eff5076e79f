"""Start the sidecar: plan the recipe, bind the Unix socket, serve until SIGTERM.

The socket file is created with mode 0600 (0660 with ``--socket-mode 0660`` for a shared
group); a file at the socket path that is not a socket is refused, never deleted. There is
no TCP data listener. Metrics go to an optional HTTP port, on loopback unless an address is
given (the operator gives the pod IP). On SIGTERM the sidecar stops accepting, writes each
rank's resume point next to the socket (``resume-rank-<r>.json``) and exits 0.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import signal
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from datalane.engine.plan import Plan
from datalane.spec.codepolicy import CodePolicy
from datalane.spec.errors import ConfigError
from datalane.spec.integrity import seal
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.wire import datalane_pb2_grpc as pbg
from datalane_sidecar.metrics import Metrics
from datalane_sidecar.service import DataLaneService
from datalane_sidecar.timing import Laps

__all__ = ["SidecarConfig", "serve", "write_termination_message"]

log = logging.getLogger("datalane.sidecar")
_MAX_MESSAGE = 256 << 20
_SIGNAL_POLL_SECONDS = 0.2
_STALE_RING = re.compile(r"datalane-[0-9a-f]{16}\.shm")  # ShmWriter files (service.py)


@dataclass(frozen=True)
class SidecarConfig:
    socket: str
    recipe: str
    store: str | None
    store_options: dict[str, Any]
    pod: str
    ranks_per_pod: int
    workers: int
    prefetch: int
    socket_mode: int
    metrics_port: int
    metrics_addr: str
    max_streams: int = 0  # 0: from the pod's ranks and the recipe's eval streams (admission.py)
    rank_processes: int = 0  # 0: sessions are threads of this process; N: N rank workers
    image_bytes: int = Knobs.image_bytes  # the knob: decoded images a lane's stream may hold
    map_processes: int = 0  # the knob: 0, map stages on threads; N: on N child processes


def _check_socket_path(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise ConfigError(f"socket path {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"socket path {path}: the folder {folder} is not writable")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory"
                if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
                else "not a socket")
        raise ConfigError(f"socket path {path} exists and is {kind}, not a socket; the "
                          f"sidecar deletes only a stale socket of its own: remove it or pass "
                          f"another --socket")
    if mode is not None:
        os.unlink(path)  # a stale socket of a previous run
    # the shared-memory rings of a previous run that was killed (kill -9, OOM): each holds
    # memory of the emptyDir (a tmpfs) until it is removed, and nothing else would remove it
    for name in os.listdir(folder):
        if _STALE_RING.fullmatch(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))


RESUME_POINT_FORMAT = "datalane.resume-point/v1"


def _bind(server: grpc.Server, path: str, mode: int) -> None:
    old = os.umask(0o777 & ~mode)
    try:
        port = server.add_insecure_port(f"unix://{os.path.abspath(path)}")
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on unix socket {path}: {e}") from e
    finally:
        os.umask(old)
    if port == 0:
        raise ConfigError(f"cannot listen on unix socket {path}")


TERMINATION_LOG_ENV = "DATALANE_TERMINATION_LOG"
TERMINATION_LOG = "/dev/termination-log"
_MAX_TERMINATION_MESSAGE = 4096  # what a kubelet keeps of it


def write_termination_message(error: BaseException, cfg: SidecarConfig | None = None) -> None:
    """Write why the sidecar stops to the container's termination message file, where the
    kubelet reads it into the pod status (``state.terminated.message``) and the operator
    reads it for the DataPipeline's ``SidecarFailed`` condition.

    The file is ``$DATALANE_TERMINATION_LOG`` if set (a local pod runner), else
    ``/dev/termination-log`` only if it exists (the kubelet creates it; nothing is created
    under /dev outside a pod). Credentials are redacted as in the logs. Best effort: a
    failure to write never hides the error itself.
    """
    path = os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG
    if TERMINATION_LOG_ENV not in os.environ and not os.path.exists(path):
        return
    from datalane.spec.errors import DatalaneError
    from datalane_sidecar.logs import CREDENTIAL_ENV, Redactor, credentials_in

    text = str(error) if isinstance(error, DatalaneError) else (
        f"{type(error).__name__}: {error}")
    secrets = [os.environ.get(name, "") for name in CREDENTIAL_ENV]
    secrets += credentials_in(cfg.store_options if cfg is not None else {})
    data = Redactor(secrets)(text).encode("utf-8", "replace")[:_MAX_TERMINATION_MESSAGE]
    data = data.decode("utf-8", "ignore").encode()  # no character cut in half
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        log.warning("cannot write the termination message", extra={"path": path,
                                                                   "error": str(e)})


def serve(cfg: SidecarConfig, ready: threading.Event | None = None,
          stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); returns the exit code. An error that stops
    the sidecar is written to its termination message first (``write_termination_message``)."""
    try:
        return _serve(cfg, ready, stop)
    except Exception as e:
        write_termination_message(e, cfg)
        raise


def _serve(cfg: SidecarConfig, ready: threading.Event | None,
           stop: threading.Event | None) -> int:
    if cfg.socket_mode not in (0o600, 0o660):
        raise ConfigError(f"socket mode {cfg.socket_mode:o} is not 600 or 660")
    laps = Laps()  # where a (re)start's time goes: logged with "serving", and a metric
    _check_socket_path(cfg.socket)
    recipe = load_recipe(cfg.recipe)
    # every predicate, of the training and the eval sources, before anything is planned or
    # imported: the allow-list the operator injected ($DATALANE_PREDICATE_MODULES)
    CodePolicy.from_env().check_recipe(recipe)
    laps.lap("recipe")
    plan = Plan.build(recipe)
    laps.lap("plan")
    store = None
    if cfg.store:
        from datalane.store import CheckpointStore

        store = CheckpointStore(cfg.store, cfg.store_options or None)
    laps.lap("store")
    metrics = Metrics()
    knobs = Knobs(workers=cfg.workers, image_bytes=cfg.image_bytes,
                  map_processes=cfg.map_processes)
    service = DataLaneService(plan, knobs, cfg.prefetch, store, cfg.pod,
                              cfg.ranks_per_pod, os.path.dirname(os.path.abspath(cfg.socket)),
                              metrics, shm_mode=cfg.socket_mode, started=laps,
                              max_streams=cfg.max_streams or None,
                              rank_processes=cfg.rank_processes)
    laps.lap("service")  # the eval streams' plans, the worker pool
    # one thread per admitted stream, checkpoint and open, and a reserve for Health: a call
    # past its limit is refused at once, so none waits for a thread (admission.py)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=service.admission.pool_size(),
                           thread_name_prefix="datalane-rpc"),
        options=[("grpc.max_send_message_length", _MAX_MESSAGE),
                 ("grpc.max_receive_message_length", _MAX_MESSAGE)])
    pbg.add_DataLaneServicer_to_server(service, server)
    _bind(server, cfg.socket, cfg.socket_mode)
    os.chmod(cfg.socket, cfg.socket_mode)
    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port, cfg.metrics_addr)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, for a stuck pod
    server.start()
    laps.lap("bind")
    for phase, seconds in laps.laps.items():
        metrics.startup.labels(phase=phase).set(seconds)
    log.info("serving", extra={"socket": cfg.socket, "fingerprint": plan.fingerprint,
                               "lanes": recipe.lanes, "store": cfg.store or "",
                               "max_streams": service.admission.max_streams,
                               "rank_processes": cfg.rank_processes,
                               "startup_seconds": laps.laps,
                               "since_start": round(laps.since_start(), 3)})
    if ready is not None:
        ready.set()
    # Wait in short slices: Linux may deliver SIGTERM to any of the server's threads, and then
    # the main thread's Python handler runs only when the main thread next wakes up; an
    # unbounded Event.wait() would never wake (the sidecar hung on SIGTERM that way).
    while not stop.wait(_SIGNAL_POLL_SECONDS):
        pass
    log.info("stopping: persisting resume points")
    points = service.drain()
    folder = os.path.dirname(os.path.abspath(cfg.socket))
    for rank, point in points.items():
        path = os.path.join(folder, f"resume-rank-{rank}.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            # sealed: a damaged file is refused by whoever reads it (check_seal)
            json.dump(seal({"format": RESUME_POINT_FORMAT, **point}), f, separators=(",", ":"))
        os.replace(tmp, path)
        log.info("resume point saved", extra={"rank": rank, "path": path})
    server.stop(grace=2).wait()
    try:
        os.unlink(cfg.socket)
    except FileNotFoundError:
        pass
    return 0
