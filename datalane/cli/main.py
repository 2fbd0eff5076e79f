"""The ``datalane`` parser and entry point (``datalane.cli:main``): the commands of
:mod:`datalane.cli.run`, ``verify``, ``demo``, ``audit`` and ``inspect``, ``--version``, and
the errors every command reports the same way (one line on stderr, exit code 2)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from datalane.cli import audit, demo, inspect, internal, run, verify
from datalane.cli.args import Parser
from datalane.spec.distribution import VERSION, missing_extra
from datalane.spec.errors import DatalaneError

__all__ = ["build_parser", "main"]

#: the extra that installs what each command imports (a missing module names it)
_EXTRA = {"run": "engine", "verify": "engine", "demo": "demo", "audit": "engine"}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="datalane", description="Deterministic, elastic data pipelines: run, "
               "verify, demo, audit and inspect.")
    p.add_argument("--version", action="version", version=f"datalane {VERSION}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (run, verify, demo, audit, inspect):
        command.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = internal.parser() if argv[:1] and argv[0] in internal.COMMANDS else build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    try:
        return int(args.fn(args))
    except DatalaneError as e:
        print(f"datalane {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        extra = "sidecar,torch" if getattr(args, "sidecars", False) else _EXTRA.get(args.command)
        message = missing_extra(e, f"datalane {args.command}", extra)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
