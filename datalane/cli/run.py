"""``datalane run``: one world in one process; ``step=<n> sha256=<global hash>`` per step,
then the summary and the realized mixture."""

from __future__ import annotations

import argparse
import os
import sys

from datalane.cli.args import Subcommands, add_knobs, knobs, natural, positive
from datalane.spec.errors import ConfigError, DatalaneError
from datalane.spec.state import Checkpoint, Counters

__all__ = ["UNSEALED_HELP", "add", "realized_mixture", "summary"]

UNSEALED_HELP = ("accept a state file without its sha256 (written by datalane 0.1), checked "
                 "field by field only: damage to it may go unnoticed")


def add(sub: Subcommands[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run one world and print per-step global hashes")
    run.add_argument("recipe")
    run.add_argument("--world", type=positive, default=1, help="data-parallel world size")
    run.add_argument("--steps", type=positive, default=None,
                     help="steps to run (default: until every lane runs out of data)")
    run.add_argument("--save-state-at", type=natural, default=None, metavar="S",
                     help="save the resume point at the boundary before step S")
    run.add_argument("--state-out", default=None, metavar="FILE")
    run.add_argument("--resume", default=None, metavar="FILE", help="resume from a state file")
    run.add_argument("--allow-unsealed-state", action="store_true", help=UNSEALED_HELP)
    add_knobs(run)
    run.set_defaults(fn=main)


def _check_state_out(path: str) -> None:
    """Refuse an output file that could not be written, before the run rather than after."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"--state-out {path} is a directory; name a file in it")
    if not os.path.isdir(folder):
        raise ConfigError(f"--state-out {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--state-out {path}: the folder {folder} is not writable")


def summary(counters: Counters, before: Counters | None, seconds: float, steps: int) -> str:
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


def main(args: argparse.Namespace) -> int:
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
    result = run_world(recipe, args.world, knobs(args), args.steps, start=start,
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
    print(summary(result.counters, before if start else None, result.seconds,
                  len(result.hashes)))
    from datalane.spec.phases import mean_weights

    steps = max(result.hashes, default=-1) + 1  # counted since step 0, as the tokens are
    print(realized_mixture([s.name for s in recipe.sources], list(mean_weights(recipe, steps)),
                           result.mixture))
    return 0
