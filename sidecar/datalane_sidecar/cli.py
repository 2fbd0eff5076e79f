"""``datalane-sidecar``: ``serve`` the lanes of a pod, or ``probe`` a running sidecar.

Every flag has an environment variable, so the operator's injected container needs only env.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from datalane.spec.errors import DatalaneError
from datalane.spec.knobs import Knobs

__all__ = ["main"]

DEFAULT_SOCKET = "/var/run/datalane/datalane.sock"
# the integer flags' bounds that are not Knobs': far above any pod, low enough that a typo of
# a few digits is refused at start rather than sizing queues and tables by it
_MAX_RANKS = 1 << 16
_MAX_PREFETCH = 1024
_MAX_STREAMS = 1 << 20


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


class _FromEnv(str):
    """An integer flag's default as its environment variable gave it: argparse converts a
    string default with the flag's ``type`` (only for the subcommand that has the flag), so a
    bad value is refused naming the variable rather than a traceback while the parser is
    built."""

    env: str

    def __new__(cls, value: str, env: str) -> _FromEnv:
        out = super().__new__(cls, value)
        out.env = env
        return out


def _knob(name: str) -> tuple[int, int]:
    """The bounds of :class:`~datalane.spec.knobs.Knobs` field ``name``: a flag that feeds it
    is refused with them under its own name, not later as ``knobs.<name>``."""
    meta = next(f.metadata for f in fields(Knobs) if f.name == name)
    return int(meta["ge"]), int(meta["le"])


def _int_flag(env: str, default: int, low: int, high: int) -> dict[str, Any]:
    """add_argument's ``type`` and ``default`` for an integer flag in ``low..high`` whose
    default is ``$env`` when set (and not empty), else ``default``."""
    def parse(text: str) -> int:
        where = f"{text.env}: " if isinstance(text, _FromEnv) else ""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{where}{text!r:.40} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{where}{value} is not in {low}..{high}")
        return value

    raw = os.environ.get(env) or ""
    return {"type": parse, "default": _FromEnv(raw, env) if raw else default}


def _parser() -> argparse.ArgumentParser:
    from datalane.spec.distribution import VERSION

    p = argparse.ArgumentParser(prog="datalane-sidecar")
    p.add_argument("--version", action="version", version=f"datalane-sidecar {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the pod's lanes on a Unix socket")
    serve.add_argument("--socket", default=_env("DATALANE_SOCKET", DEFAULT_SOCKET))
    serve.add_argument("--recipe", default=_env("DATALANE_RECIPE"),
                       help="recipe file (env DATALANE_RECIPE)")
    serve.add_argument("--store", default=_env("DATALANE_STORE"),
                       help="checkpoint store URI (env DATALANE_STORE)")
    serve.add_argument("--store-options", default=_env("DATALANE_STORE_OPTIONS", "{}"),
                       help="fsspec storage options as JSON (env DATALANE_STORE_OPTIONS)")
    serve.add_argument("--pod", default=_env("DATALANE_POD", _env("POD_NAME",
                                                                  socket.gethostname())))
    serve.add_argument("--ranks-per-pod", **_int_flag("DATALANE_RANKS_PER_POD", 1, 1, _MAX_RANKS),
                       help="data-parallel ranks this pod serves; the pod object of a step is "
                            "written once each has asked for a checkpoint (tensor/context-"
                            "parallel peers reading one data-parallel rank count once) (env "
                            "DATALANE_RANKS_PER_POD)")
    serve.add_argument("--workers", **_int_flag("DATALANE_WORKERS", Knobs.workers,
                                                *_knob("workers")))
    serve.add_argument("--map-processes", **_int_flag("DATALANE_MAP_PROCESSES",
                                                      Knobs.map_processes,
                                                      *_knob("map_processes")),
                       help="run the map stages (decode, render, tokenize) in N child "
                            "processes instead of --workers threads (in each rank worker with "
                            "--rank-processes), so they do not share one interpreter lock; 0: "
                            "threads (the default). Each holds a copy of the recipe's "
                            "tokenizers and templates (docs/architecture.md, Map processes) "
                            "(env DATALANE_MAP_PROCESSES)")
    serve.add_argument("--prefetch", **_int_flag("DATALANE_PREFETCH", 8, 1, _MAX_PREFETCH),
                       help="microbatches ready ahead of each session's slowest reader")
    serve.add_argument("--image-bytes", **_int_flag("DATALANE_IMAGE_BYTES", Knobs.image_bytes,
                                                    *_knob("image_bytes")),
                       help="decoded image bytes each lane's image source may hold in map "
                            "results and tasks in flight (backpressure: the data is the same "
                            "at any value; docs/architecture.md, Backpressure) (env "
                            "DATALANE_IMAGE_BYTES)")
    serve.add_argument("--max-streams", **_int_flag("DATALANE_MAX_STREAMS", 0, 0, _MAX_STREAMS),
                       help="streams served at once (trainer processes x (1 + eval streams "
                            "read at once)); a stream past it is refused with "
                            "RESOURCE_EXHAUSTED. 0: max(256, ranks-per-pod x 8 x (1 + eval "
                            "streams)) (env DATALANE_MAX_STREAMS)")
    serve.add_argument("--rank-processes", default=_env("DATALANE_RANK_PROCESSES", "0"),
                       help="run the ranks' sessions in N worker processes (rank r in worker "
                            "r %% N), each with its own map pool, so ranks do not share one "
                            "interpreter lock; 0: threads of the server process (the default); "
                            "auto: one per rank of the pod (--ranks-per-pod), at most one per "
                            "CPU, 0 for a pod of one rank. Each worker holds a copy of the "
                            "plan and its ranks' windows: see docs/architecture.md, "
                            "The sidecar's processes (env DATALANE_RANK_PROCESSES)")
    serve.add_argument("--socket-mode", default=_env("DATALANE_SOCKET_MODE", "0600"),
                       choices=["0600", "0660"])
    serve.add_argument("--metrics-port", **_int_flag("DATALANE_METRICS_PORT", 0, 0, 65535))
    serve.add_argument("--metrics-addr", default=_env("DATALANE_METRICS_ADDR", "127.0.0.1"),
                       help="address of the metrics port: loopback unless told (the operator "
                            "passes the pod IP) (env DATALANE_METRICS_ADDR)")
    serve.add_argument("--log-level", default=_env("DATALANE_LOG_LEVEL", "info"),
                       help="credentials are redacted at every level; the storage libraries "
                            "log at INFO at the most (env DATALANE_LOG_LEVEL)")
    probe = sub.add_parser("probe", help="exit 0 if the sidecar on the socket is serving")
    probe.add_argument("--socket", default=_env("DATALANE_SOCKET", DEFAULT_SOCKET))
    probe.add_argument("--timeout", type=float, default=2.0)
    return p


def rank_processes(value: str, ranks_per_pod: int) -> int:
    """The worker processes ``--rank-processes`` asks for (``auto``: one per rank of the pod,
    at most one per CPU this process may run on; none for a pod of one rank). A count is
    capped at the pod's ranks: a worker no rank is dealt to would only hold memory."""
    if value == "auto":
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        return min(ranks_per_pod, cpus) if ranks_per_pod > 1 else 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise DatalaneError(f"--rank-processes must be 0, a number of processes or auto, "
                            f"not {value!r}")
    return min(count, max(ranks_per_pod, 1))  # rank r runs in worker r % N: more would idle


def _serve(args: argparse.Namespace) -> int:
    from datalane_sidecar.logs import setup_logging
    from datalane_sidecar.server import SidecarConfig, serve

    try:
        options = json.loads(args.store_options)
    except json.JSONDecodeError as e:
        raise DatalaneError(f"--store-options is not JSON: {e}") from e
    setup_logging(args.log_level, options)
    if not args.recipe:
        raise DatalaneError("no recipe: pass --recipe or set DATALANE_RECIPE")
    cfg = SidecarConfig(args.socket, args.recipe, args.store, options, args.pod,
                        args.ranks_per_pod, args.workers, args.prefetch,
                        int(args.socket_mode, 8), args.metrics_port, args.metrics_addr,
                        args.max_streams, rank_processes(args.rank_processes,
                                                         args.ranks_per_pod), args.image_bytes,
                        args.map_processes)
    return serve(cfg)


def _probe(args: argparse.Namespace) -> int:
    import grpc

    from datalane.wire import datalane_pb2 as pb
    from datalane.wire import datalane_pb2_grpc as pbg

    try:
        with grpc.insecure_channel(f"unix://{os.path.abspath(args.socket)}") as channel:
            reply = pbg.DataLaneStub(channel).Health(pb.HealthRequest(), timeout=args.timeout)
    except grpc.RpcError as e:
        print(f"not serving: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    print(f"serving={reply.serving} protocol={reply.protocol_version} "
          f"fingerprint={reply.fingerprint[:16]}")
    return 0 if reply.serving else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _serve(args) if args.command == "serve" else _probe(args)
    except DatalaneError as e:
        print(f"datalane-sidecar {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
