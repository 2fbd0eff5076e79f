"""``datalane verify``: every world size x worker count, plus resumes on another topology
(:mod:`datalane.verify`); exits 0 only if every step hash agrees."""

from __future__ import annotations

import argparse

from datalane.cli.args import Subcommands, ints, positive

__all__ = ["add"]


def add(sub: Subcommands[argparse.ArgumentParser]) -> None:
    ver = sub.add_parser("verify", help="check that every topology gives the same batches")
    ver.add_argument("recipe")
    ver.add_argument("--steps", type=positive, required=True)
    ver.add_argument("--worlds", type=ints, default=[1, 2, 4])
    ver.add_argument("--workers", type=ints, default=[1, 3])
    ver.add_argument("--resume-at", type=ints, default=[])
    ver.add_argument("--prefetch", type=int, default=8)
    ver.add_argument("--map-processes", type=int, default=0, metavar="N",
                     help="also run the first world with the map stages in N child processes "
                          "(the map_processes knob; 0: not)")
    ver.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    from datalane.verify import verify

    ok = verify(args.recipe, args.steps, args.worlds, args.workers, args.resume_at,
                prefetch=args.prefetch, map_processes=args.map_processes)
    return 0 if ok else 1
