"""``datalane-operator``: run the operator, print the CRD, or make webhook certificates.

Subcommands:

* ``run``   - the kopf operator: reconcile DataPipelines and serve the admission webhooks
  over TLS (in a cluster: the files of the mounted Secret; locally: any loopback address,
  see docs/operator.md);
* ``crd``   - print the generated CustomResourceDefinition (what ``crds/`` holds);
* ``reference`` - print (or ``--write`` into docs/operator.md) the CR field reference;
* ``certs`` - create or renew the webhook CA and serving certificate in a Secret (what the
  Helm hook Job runs), or write them to a folder.

Every ``run`` flag has an environment variable (``DATALANE_OPERATOR_<FLAG>``), so the
Deployment needs only env. With ``--leader-election-lease`` (the chart sets it), replicas
elect a leader through that Lease: all serve the webhooks, the leader alone reconciles.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from datalane_operator.leader import LeaseConfig
from datalane_operator.storage import DEFAULT_PROTOCOLS

__all__ = ["main"]


def _env(flag: str, default: str | None = None) -> str | None:
    return os.environ.get("DATALANE_OPERATOR_" + flag.upper().replace("-", "_"), default)


def _parser() -> argparse.ArgumentParser:
    from datalane.spec.distribution import VERSION

    p = argparse.ArgumentParser(prog="datalane-operator")
    p.add_argument("--version", action="version", version=f"datalane-operator {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator and its admission webhooks")
    run.add_argument("--namespace", action="append", default=None,
                     help="watch only this namespace (repeatable); default: all namespaces")
    run.add_argument("--sidecar-image", default=_env("sidecar-image", ""),
                     help="sidecar image for pipelines that set no spec.sidecar.image")
    run.add_argument("--webhook-addr", default=_env("webhook-addr", "0.0.0.0"))
    run.add_argument("--webhook-port", type=int, default=int(_env("webhook-port", "9443") or 0))
    run.add_argument("--webhook-host", default=_env("webhook-host"),
                     help="host name in the webhook URLs kopf reports (logs only)")
    run.add_argument("--tls-dir", default=_env("tls-dir"),
                     help="folder with tls.crt, tls.key and ca.crt (the webhook Secret)")
    run.add_argument("--webhook-configuration", default=_env("webhook-configuration", ""),
                     help="name of the Mutating- and ValidatingWebhookConfiguration whose "
                          "caBundle the operator keeps equal to ca.crt")
    run.add_argument("--storage-interval", type=float,
                     default=float(_env("storage-interval", "30") or 30),
                     help="seconds between looks at each checkpoint store")
    run.add_argument("--recipe-grace", type=float,
                     default=float(_env("recipe-grace", "30") or 30),
                     help="seconds an old recipe ConfigMap stays unmounted before the leader "
                          "deletes it")
    run.add_argument("--liveness", default=_env("liveness", "http://0.0.0.0:8080/healthz"),
                     help="kopf's liveness endpoint (also reports admission latency)")
    run.add_argument("--metrics", default=_env("metrics", ""),
                     help="serve Prometheus metrics at this http://HOST:PORT/PATH (the chart: "
                          "http://0.0.0.0:8081/metrics); empty: none")
    run.add_argument("--allow-operator-identity", action="store_true",
                     default=_env("allow-operator-identity", "false") == "true",
                     help="let the operator list and garbage-collect checkpoint stores with "
                          "its own identity (no secretRef, file://), under "
                          "--operator-identity-prefixes if given (cluster policy)")
    run.add_argument("--operator-identity-prefixes", default=_env("operator-identity-prefixes",
                                                                  ""),
                     help='JSON {namespace: [URI prefix, ...]} ("*": every namespace) where '
                          "the operator's own identity may act; empty: everywhere")
    run.add_argument("--predicate-modules", default=_env("predicate-modules", ""),
                     help="comma-separated module prefixes that recipe filter predicates may "
                          "come from; empty: no predicate is admitted")
    run.add_argument("--sidecar-protocols", default=_env("sidecar-protocols",
                                                         ",".join(DEFAULT_PROTOCOLS)),
                     help="comma-separated URI schemes the sidecar image reads (Helm value "
                          "sidecar.protocols); admission warns about any other in a recipe")
    run.add_argument("--leader-election-lease", default=_env("leader-election-lease", ""),
                     help="name of the coordination.k8s.io Lease whose holder reconciles "
                          "(every replica serves the webhooks); empty: this process always "
                          "leads (a single operator)")
    run.add_argument("--leader-election-namespace",
                     default=_env("leader-election-namespace", ""),
                     help="namespace of the Lease (the chart: the operator's own)")
    run.add_argument("--leader-election-identity", default=_env("leader-election-identity"),
                     help="this replica's name in the Lease (default: the pod's name, or the "
                          "host name, plus a random suffix)")
    run.add_argument("--lease-duration", type=float,
                     default=float(_env("lease-duration", "15") or 15),
                     help="seconds without renewal after which another replica takes over")
    run.add_argument("--renew-deadline", type=float,
                     default=float(_env("renew-deadline", "10") or 10),
                     help="seconds the leader keeps acting without a successful renewal")
    run.add_argument("--retry-period", type=float,
                     default=float(_env("retry-period", "2") or 2),
                     help="seconds between two looks at the Lease")
    run.add_argument("--log-format", choices=["plain", "full", "json"],
                     default=_env("log-format", "full"))
    run.add_argument("--verbose", action="store_true")
    sub.add_parser("crd", help="print the DataPipeline CRD (YAML)")
    ref = sub.add_parser("reference", help="print the DataPipeline field reference (Markdown)")
    ref.add_argument("--write", metavar="FILE",
                     help="rewrite the generated section of FILE (docs/operator.md) instead")
    certs = sub.add_parser("certs", help="create or renew the webhook certificates")
    certs.add_argument("--service", default=_env("service", "datalane-operator"),
                       help="Service of the webhook (its DNS names go in the certificate)")
    certs.add_argument("--namespace", default=_env("namespace", "default"))
    certs.add_argument("--host", action="append", default=[],
                       help="another DNS name or IP address (repeatable)")
    where = certs.add_mutually_exclusive_group(required=True)
    where.add_argument("--secret", help="keep them in this Secret (kubernetes.io/tls)")
    where.add_argument("--out", help="write ca.crt, tls.crt and tls.key into this folder")
    return p


def _lease(args: argparse.Namespace) -> LeaseConfig | None:
    if not args.leader_election_lease:
        return None
    identity = args.leader_election_identity or (
        f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}")
    return LeaseConfig(args.leader_election_lease, args.leader_election_namespace, identity,
                       args.lease_duration, args.renew_deadline, args.retry_period)


def _protocols(text: str) -> tuple[str, ...]:
    from datalane.spec.errors import ConfigError

    out = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    for p in out:
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*", p):
            raise ConfigError(f"--sidecar-protocols: {p!r} is not a URI scheme (s3, gs, ...)")
    return out


def _run(args: argparse.Namespace) -> int:
    import kopf

    from datalane.spec.errors import ConfigError
    from datalane_operator import handlers  # noqa: F401  (registers the kopf handlers)
    from datalane_operator.metrics import parse_endpoint
    from datalane_operator.policy import Policy
    from datalane_operator.runtime import OperatorConfig, Runtime

    try:
        policy = Policy.from_flags(args.allow_operator_identity,
                                   args.operator_identity_prefixes, args.predicate_modules)
        protocols = _protocols(args.sidecar_protocols)
        lease = _lease(args)
        if args.metrics:
            parse_endpoint(args.metrics)
        if not args.recipe_grace >= 0:
            raise ConfigError(f"--recipe-grace {args.recipe_grace} must be a number of seconds "
                              f">= 0")
    except ConfigError as e:
        sys.stderr.write(f"datalane-operator run: {e}\n")
        return 2
    if not args.tls_dir:
        sys.stderr.write("datalane-operator run: --tls-dir is required (tls.crt, tls.key, "
                         "ca.crt); make them with `datalane-operator certs --out DIR --host "
                         "127.0.0.1`\n")
        return 2
    tls = Path(args.tls_dir)
    cfg = OperatorConfig(
        sidecar_image=args.sidecar_image, webhook_addr=args.webhook_addr,
        webhook_port=args.webhook_port, webhook_host=args.webhook_host,
        tls_cert=str(tls / "tls.crt"), tls_key=str(tls / "tls.key"),
        ca_file=str(tls / "ca.crt"), webhook_configuration=args.webhook_configuration,
        storage_interval=args.storage_interval, recipe_grace=args.recipe_grace,
        namespaces=tuple(args.namespace or ()),
        policy=policy, sidecar_protocols=protocols, lease=lease,
        metrics_endpoint=args.metrics)
    fmt = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL,
           "json": kopf.LogFormat.JSON}[args.log_format]
    kopf.configure(verbose=args.verbose, log_format=fmt)
    if not args.verbose:  # one line per admission review and per handler call is noise
        import logging

        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(standalone=True, clusterwide=not args.namespace,
             namespaces=args.namespace or (), liveness_endpoint=args.liveness or None,
             memo=kopf.Memo(runtime=Runtime(cfg)))
    return 0


def _certs(args: argparse.Namespace) -> int:
    from datalane_operator.certs import make_bundle, service_names

    hosts = [*service_names(args.service, args.namespace), *args.host]
    if args.out:
        bundle = make_bundle(hosts)
        paths = bundle.write(Path(args.out))
        sys.stdout.write("wrote " + ", ".join(str(p) for p in paths) + "\n")
        return 0
    from datalane_operator.secrets import ensure_tls_secret

    sys.stdout.write(ensure_tls_secret(args.namespace, args.secret, hosts) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "crd":
        from datalane_operator.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    if args.command == "certs":
        return _certs(args)
    if args.command == "reference":
        from datalane_operator.reference import render_reference, rewrite

        if args.write:
            changed = rewrite(Path(args.write))
            sys.stdout.write(f"{args.write}: {'updated' if changed else 'up to date'}\n")
        else:
            sys.stdout.write(render_reference())
        return 0
    return _run(args)
