"""``datalane demo``: the elastic demo (:mod:`datalane.demos.elastic`: 4 rank processes,
resumed on 2, then on 8), or with ``--sidecars`` through sidecar processes and a checkpoint
store (:mod:`datalane.demos.sidecars`)."""

from __future__ import annotations

import argparse

from datalane.cli.args import Subcommands, positive
from datalane.spec.errors import DatalaneError

__all__ = ["add"]


def add(sub: Subcommands[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="elastic demo: 4 ranks, resume on 2, then on 8")
    demo.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    demo.add_argument("--steps", type=positive, default=8, help="steps per phase")
    demo.add_argument("--keep", action="store_true", help="keep the work folder")
    demo.add_argument("--sidecars", action="store_true",
                      help="through sidecar processes, Unix sockets and a checkpoint store: "
                           "2 pods x 2 ranks, then 1 pod, then 4 pods")
    demo.add_argument("--store", default=None,
                      help="checkpoint store URI for --sidecars (default: a local folder; "
                           "s3:// works, options from $DATALANE_STORE_OPTIONS)")
    demo.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    if args.sidecars:
        from datalane.demos.sidecars import run_sidecar_demo

        return run_sidecar_demo(args.dir, args.steps, args.store, keep=args.keep)
    if args.store:
        raise DatalaneError("--store goes with --sidecars")
    from datalane.demos.elastic import run_demo

    return run_demo(args.dir, args.steps, keep=args.keep)
