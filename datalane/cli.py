"""The ``datalane`` command: run, verify, demo and inspect.

* ``run``     - one world in one process; prints ``step=<n> sha256=<global hash>`` per step.
* ``verify``  - every world size x worker count, plus resumes on another topology; exits 0
                only if every step hash agrees.
* ``demo``    - the elastic demo with one OS process per rank (see :mod:`datalane.demo`).
* ``inspect`` - a resume point in human form.
* ``audit``   - the ledger of a checkpoint store, hash chain (and, with ``--key``, the
                manifests' HMAC signatures) verified.

Every refused input is one line on stderr naming the value, exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from datalane.spec.errors import ConfigError, DatalaneError
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint, Counters

__all__ = ["main"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers") from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not at least {low}")
        return value

    parse.__name__ = "integer"  # what argparse calls the type in its messages
    return parse


_positive = _at_least(1)
_natural = _at_least(0)


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line naming the value (exit code 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _check_state_out(path: str) -> None:
    """Refuse an output file that could not be written, before the run rather than after."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"--state-out {path} is a directory; name a file in it")
    if not os.path.isdir(folder):
        raise ConfigError(f"--state-out {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--state-out {path}: the folder {folder} is not writable")


def _knobs(args: argparse.Namespace, workers: int | None = None) -> Knobs:
    from datalane.spec import model

    return model.load(Knobs, {"workers": workers or args.workers, "prefetch": args.prefetch},
                      "knobs")


def _summary(counters: Counters, before: Counters | None, seconds: float, steps: int,
             ) -> str:
    tokens = counters.tokens - (before.tokens if before else 0)
    padding = counters.padding - (before.padding if before else 0)
    docs = counters.docs - (before.docs if before else 0)
    skipped = dict(counters.skipped)
    for k, v in (before.skipped if before else {}).items():
        skipped[k] = skipped.get(k, 0) - v
    skipped = {k: v for k, v in sorted(skipped.items()) if v}
    total = tokens + padding
    rate = tokens / seconds if seconds > 0 else 0.0
    skip_text = ", ".join(f"{k}={v}" for k, v in skipped.items()) or "none"
    return (f"steps={steps} tokens={tokens} tokens_per_s={rate:,.0f} documents_read={docs} "
            f"skipped={sum(skipped.values())} ({skip_text}) "
            f"padding_fraction={padding / total if total else 0.0:.4f} seconds={seconds:.2f}")


def realized_mixture(names: list[str], weights: list[float], tokens: list[int]) -> str:
    """``mixture: web=0.6993 (weight 0.7000) code=...``: each source's share of the tokens
    the mixture has taken so far, next to its share of the weights."""
    total_w = sum(weights)
    total_t = sum(tokens)
    parts = [f"{n}={t / total_t if total_t else 0.0:.4f} (weight {w / total_w:.4f})"
             for n, w, t in zip(names, weights, tokens, strict=True)]
    return "mixture: " + " ".join(parts)


def _cmd_run(args: argparse.Namespace) -> int:
    from datalane.runner import run_world
    from datalane.spec.recipe import load_recipe

    if (args.save_state_at is None) != (args.state_out is None):
        raise ConfigError("--save-state-at and --state-out go together")
    if args.state_out is not None:
        _check_state_out(args.state_out)
    recipe = load_recipe(args.recipe)
    start = (Checkpoint.load(args.resume, allow_unsealed=args.allow_unsealed_state)
             if args.resume else None)
    save_at = frozenset([args.save_state_at]) if args.save_state_at is not None else frozenset()
    first = start.step if start else 0
    if args.save_state_at is not None and not (
            first <= args.save_state_at <= first + (args.steps or args.save_state_at)):
        last = "the end of the data" if args.steps is None else str(first + args.steps)
        raise ConfigError(f"--save-state-at {args.save_state_at} lies outside this run, which "
                          f"saves boundaries {first} to {last}")
    result = run_world(recipe, args.world, _knobs(args), args.steps, start=start,
                       save_at=save_at,
                       on_step=lambda s, h: print(f"step={s} sha256={h}", flush=True))
    if args.save_state_at is not None:
        ckpt = result.checkpoints.get(args.save_state_at)
        if ckpt is None:
            raise DatalaneError(f"--save-state-at {args.save_state_at} was never reached "
                                f"(the run covered steps {min(result.hashes, default=0)}-"
                                f"{max(result.hashes, default=-1)})")
        with open(args.state_out, "w", encoding="utf-8") as f:
            f.write(ckpt.dumps())
        print(f"saved state of step {ckpt.step} to {args.state_out}", file=sys.stderr)
    before = Counters()
    for lane in (start.lanes.values() if start else []):
        before.add(lane.counters)
    print(_summary(result.counters, before if start else None, result.seconds,
                   len(result.hashes)))
    from datalane.spec.phases import mean_weights

    steps = max(result.hashes, default=-1) + 1  # counted since step 0, as the tokens are
    print(realized_mixture([s.name for s in recipe.sources], list(mean_weights(recipe, steps)),
                           result.mixture))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from datalane.verify import verify

    recipe_path = args.recipe
    ok = verify(recipe_path, args.steps, args.worlds, args.workers, args.resume_at,
                prefetch=args.prefetch)
    return 0 if ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.sidecars:
        from datalane.demo_sidecars import run_sidecar_demo

        return run_sidecar_demo(args.dir, args.steps, args.store, keep=args.keep)
    if args.store:
        raise DatalaneError("--store goes with --sidecars")
    from datalane.demo import run_demo

    return run_demo(args.dir, args.steps, keep=args.keep)


def _cmd_trainer(args: argparse.Namespace) -> int:
    from datalane.demo_sidecars import trainer_main

    return trainer_main(args)


def _cmd_audit(args: argparse.Namespace) -> int:
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


def _cmd_inspect(args: argparse.Namespace) -> int:
    from datalane.inspect_state import describe

    print(describe(Checkpoint.load(args.state, allow_unsealed=args.allow_unsealed_state),
                   raw=args.json))
    return 0


def _cmd_rank(args: argparse.Namespace) -> int:
    from datalane.demo import rank_main

    return rank_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="datalane", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def knobs(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--workers", type=int, default=2, help="map worker threads")
        sp.add_argument("--prefetch", type=int, default=8, help="map tasks in flight per stream")

    run = sub.add_parser("run", help="run one world and print per-step global hashes")
    run.add_argument("recipe")
    run.add_argument("--world", type=_positive, default=1, help="data-parallel world size")
    run.add_argument("--steps", type=_positive, default=None,
                     help="steps to run (default: until every lane runs out of data)")
    run.add_argument("--save-state-at", type=_natural, default=None, metavar="S",
                     help="save the resume point at the boundary before step S")
    run.add_argument("--state-out", default=None, metavar="FILE")
    run.add_argument("--resume", default=None, metavar="FILE", help="resume from a state file")
    unsealed = ("accept a state file without its sha256 (written by datalane 0.1), checked "
                "field by field only: damage to it may go unnoticed")
    run.add_argument("--allow-unsealed-state", action="store_true", help=unsealed)
    knobs(run)
    run.set_defaults(fn=_cmd_run)

    ver = sub.add_parser("verify", help="check that every topology gives the same batches")
    ver.add_argument("recipe")
    ver.add_argument("--steps", type=_positive, required=True)
    ver.add_argument("--worlds", type=_ints, default=[1, 2, 4])
    ver.add_argument("--workers", type=_ints, default=[1, 3])
    ver.add_argument("--resume-at", type=_ints, default=[])
    ver.add_argument("--prefetch", type=int, default=8)
    ver.set_defaults(fn=_cmd_verify)

    demo = sub.add_parser("demo", help="elastic demo: 4 ranks, resume on 2, then on 8")
    demo.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    demo.add_argument("--steps", type=_positive, default=8, help="steps per phase")
    demo.add_argument("--keep", action="store_true", help="keep the work folder")
    demo.add_argument("--sidecars", action="store_true",
                      help="through sidecar processes, Unix sockets and a checkpoint store: "
                           "2 pods x 2 ranks, then 1 pod, then 4 pods")
    demo.add_argument("--store", default=None,
                      help="checkpoint store URI for --sidecars (default: a local folder; "
                           "s3:// works, options from $DATALANE_STORE_OPTIONS)")
    demo.set_defaults(fn=_cmd_demo)

    audit = sub.add_parser("audit", help="print the ledger of a checkpoint store and verify "
                                         "the hash chain of every committed checkpoint")
    audit.add_argument("store")
    audit.add_argument("--store-options", default=os.environ.get("DATALANE_STORE_OPTIONS"),
                       help="fsspec storage options as JSON")
    audit.add_argument("--key", default=None, metavar="FILE",
                       help="ledger key file: every manifest must carry a valid HMAC signature "
                            "made with it (see docs/checkpoint-format.md)")
    audit.set_defaults(fn=_cmd_audit)

    trainer = sub.add_parser("_trainer", help=argparse.SUPPRESS)  # a demo trainer process
    trainer.add_argument("--socket", required=True)
    trainer.add_argument("--rank", type=int, required=True)
    trainer.add_argument("--world", type=int, required=True)
    trainer.add_argument("--steps", type=int, required=True)
    trainer.add_argument("--microbatch", type=int, default=2)
    trainer.add_argument("--resume-step", type=_natural, default=None)
    trainer.set_defaults(fn=_cmd_trainer)

    ins = sub.add_parser("inspect", help="print a state file in human form")
    ins.add_argument("state")
    ins.add_argument("--json", action="store_true", help="also print each lane state's JSON")
    ins.add_argument("--allow-unsealed-state", action="store_true", help=unsealed)
    ins.set_defaults(fn=_cmd_inspect)

    rank = sub.add_parser("_rank", help=argparse.SUPPRESS)  # one rank process of the demo
    rank.add_argument("--recipe", required=True)
    rank.add_argument("--rank", type=int, required=True)
    rank.add_argument("--world", type=int, required=True)
    rank.add_argument("--steps", type=int, required=True)
    rank.add_argument("--resume", default=None)
    rank.add_argument("--state-out", required=True)
    rank.add_argument("--workers", type=int, default=1)
    rank.set_defaults(fn=_cmd_rank)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    try:
        return int(args.fn(args))
    except DatalaneError as e:
        print(f"datalane {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


