"""The demos' own processes, started as ``python -m datalane.cli _rank ...`` and
``... _trainer ...``: not commands for people, so they are parsed here and never listed in
``datalane --help``."""

from __future__ import annotations

import argparse

from datalane.cli.args import Parser, natural

__all__ = ["COMMANDS", "parser"]

COMMANDS = ("_rank", "_trainer")


def _rank(args: argparse.Namespace) -> int:
    from datalane.demos.elastic import rank_main

    return rank_main(args)


def _trainer(args: argparse.Namespace) -> int:
    from datalane.demos.sidecars import trainer_main

    return trainer_main(args)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="datalane")
    sub = p.add_subparsers(dest="command", required=True)
    rank = sub.add_parser("_rank")  # one rank process of the demo
    rank.add_argument("--recipe", required=True)
    rank.add_argument("--rank", type=int, required=True)
    rank.add_argument("--world", type=int, required=True)
    rank.add_argument("--steps", type=int, required=True)
    rank.add_argument("--resume", default=None)
    rank.add_argument("--state-out", required=True)
    rank.add_argument("--workers", type=int, default=1)
    rank.set_defaults(fn=_rank)

    trainer = sub.add_parser("_trainer")  # a trainer process of the sidecar demo
    trainer.add_argument("--socket", required=True)
    trainer.add_argument("--rank", type=int, required=True)
    trainer.add_argument("--world", type=int, required=True)
    trainer.add_argument("--steps", type=int, required=True)
    trainer.add_argument("--microbatch", type=int, default=2)
    trainer.add_argument("--resume-step", type=natural, default=None)
    trainer.set_defaults(fn=_trainer)
    return p
