"""``datalane audit``: the ledger of a checkpoint store, its hash chain (and, with ``--key``,
the manifests' HMAC signatures) verified."""

from __future__ import annotations

import argparse
import os

from datalane.cli.args import Subcommands
from datalane.spec.errors import ConfigError

__all__ = ["add"]


def add(sub: Subcommands[argparse.ArgumentParser]) -> None:
    audit = sub.add_parser("audit", help="print the ledger of a checkpoint store and verify "
                                         "the hash chain of every committed checkpoint")
    audit.add_argument("store")
    audit.add_argument("--store-options", default=os.environ.get("DATALANE_STORE_OPTIONS"),
                       help="fsspec storage options as JSON")
    audit.add_argument("--key", default=None, metavar="FILE",
                       help="ledger key file: every manifest must carry a valid HMAC signature "
                            "made with it (see docs/checkpoint-format.md)")
    audit.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    from datalane.spec.integrity import parse_json
    from datalane.store import CheckpointStore, read_ledger_key

    options = (parse_json(args.store_options, "--store-options") if args.store_options
               else None)
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"--store-options must be a JSON object, got {args.store_options}")
    key = read_ledger_key(args.key) if args.key else None
    report = CheckpointStore(args.store, options).audit(key=key)
    print(report.text())
    return 0 if report.ok else 1
