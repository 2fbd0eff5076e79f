"""``datalane inspect``: a state file (a resume point) in human form
(:mod:`datalane.inspect_state`)."""

from __future__ import annotations

import argparse

from datalane.cli.args import Subcommands
from datalane.cli.run import UNSEALED_HELP
from datalane.spec.state import Checkpoint

__all__ = ["add"]


def add(sub: Subcommands[argparse.ArgumentParser]) -> None:
    ins = sub.add_parser("inspect", help="print a state file in human form")
    ins.add_argument("state")
    ins.add_argument("--json", action="store_true", help="also print each lane state's JSON")
    ins.add_argument("--allow-unsealed-state", action="store_true", help=UNSEALED_HELP)
    ins.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    from datalane.inspect_state import describe

    print(describe(Checkpoint.load(args.state, allow_unsealed=args.allow_unsealed_state),
                   raw=args.json))
    return 0
