#!/usr/bin/env python3
"""One-line mutations of a module, each run against the tests that should catch it.

    .venv/bin/python tools/mutate.py datalane/engine/mixture.py -- tests/engine/test_mixture.py
    .venv/bin/python tools/mutate.py datalane/engine/rng.py --lines 30-54 --max 40 -- tests/engine

Every mutation changes one thing on one line, the way a slip of the keyboard would: a
comparison turned around or loosened (``<`` and ``<=``, ``==`` and ``!=``, ``in`` and ``not
in``), ``and`` and ``or`` swapped, ``+`` and ``-``, an integer one more, ``True`` and ``False``,
a ``not`` dropped, a statement replaced by ``pass`` (an assignment, a call, a ``raise``, a
``return`` of a value). The module is written back with the mutation (``ast.unparse``: the
comments go, the meaning stays), the tests after ``--`` run with ``-x`` under a time limit, and
the file is restored whatever happens. A mutant the tests pass is a *survivor*: a line whose
behaviour no test pins down. The report lists the survivors with their lines; ``--json``
writes every result.

The unmutated module, written back the same way, must pass first (otherwise every mutant
would look killed). Run it from the repository root with ``PYTHONPATH`` set as for the tests;
bytecode goes to a private cache so a restored file is never run from a mutant's ``.pyc``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
          ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
          ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Return)


@dataclass
class Mutant:
    index: int
    line: int
    what: str
    source: str  # the original line
    outcome: str = ""  # killed, survived, timeout
    seconds: float = 0.0


def _say(*args: Any, **kwargs: Any) -> None:
    print(*args, **kwargs, flush=True)  # noqa: T201  (a command-line tool's report, as it goes)


def _sites(tree: ast.Module) -> Iterator[tuple[ast.AST, str, int]]:
    """(node, description, variant) for every mutation the module admits, in file order."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in _COMPARE:
                    yield node, f"{type(op).__name__} -> {_COMPARE[type(op)].__name__}", k
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            yield node, f"{type(node.op).__name__} -> {_BINOP[type(node.op)].__name__}", 0
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP:
            yield node, f"{type(node.op).__name__}= -> {_BINOP[type(node.op)].__name__}=", 0
        elif isinstance(node, ast.BoolOp):
            swapped = "Or" if isinstance(node.op, ast.And) else "And"
            yield node, f"{type(node.op).__name__} -> {swapped}", 0
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not dropped", 0
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, f"{node.value} -> {not node.value}", 0
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, f"{node.value} -> {node.value + 1}", 0
        if isinstance(node, _STATEMENTS) and not _is_dunder_all(node) and not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) and not (
                isinstance(node, ast.Return) and node.value is None):
            yield node, f"{type(node).__name__} -> pass", 1


def _is_dunder_all(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


class _Apply(ast.NodeTransformer):
    def __init__(self, target: int, variant: int) -> None:
        self.target, self.variant = target, variant

    def visit(self, node: ast.AST) -> ast.AST:
        node = self.generic_visit(node)
        if getattr(node, "_mutant_id", None) != self.target:
            return node
        if self.variant == 1 and isinstance(node, _STATEMENTS):  # (a Compare's 1: its 2nd op)
            return ast.copy_location(ast.Pass(), node)
        if isinstance(node, ast.Compare):
            node.ops[self.variant] = _COMPARE[type(node.ops[self.variant])]()
        elif isinstance(node, (ast.BinOp, ast.AugAssign)):
            node.op = _BINOP[type(node.op)]()
        elif isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.UnaryOp):
            return node.operand
        elif isinstance(node, ast.Constant):
            value = node.value
            assert isinstance(value, int)  # (bool is an int)
            node.value = (not value) if type(value) is bool else value + 1
        return node


def mutants(source: str, lines: tuple[int, int] | None) -> list[tuple[Mutant, str]]:
    """Every mutant of ``source`` (within ``lines``) with its whole mutated module."""
    tree = ast.parse(source)
    sites = []
    for node, what, variant in _sites(tree):
        line = getattr(node, "lineno", 0)
        if lines is None or lines[0] <= line <= lines[1]:
            sites.append((node, what, variant, line))
    text = source.splitlines()
    out = []
    for i, (node, what, variant, line) in enumerate(sorted(sites, key=lambda s: s[3])):
        node._mutant_id = i  # type: ignore[attr-defined]
        mutated = _Apply(i, variant).visit(copy.deepcopy(tree))
        del node._mutant_id  # type: ignore[attr-defined]
        ast.fix_missing_locations(mutated)
        out.append((Mutant(i, line, what, text[line - 1].strip() if line else ""),
                    ast.unparse(mutated)))
    return out


def _run_tests(tests: list[str], timeout: float, env: dict[str, str]) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                               "no:cacheprovider", *tests], env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0
    return ("survived" if proc.returncode == 0 else "killed"), time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module", help="the file to mutate, e.g. datalane/engine/mixture.py")
    ap.add_argument("tests", nargs="+", help="pytest arguments (after --)")
    ap.add_argument("--lines", help="only mutations on lines A-B")
    ap.add_argument("--max", type=int, default=0, help="at most this many mutants (0: all)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    path = Path(args.module)
    original = path.read_text()
    lines = None
    if args.lines:
        a, _, b = args.lines.partition("-")
        lines = (int(a), int(b or a))
    todo = mutants(original, lines)
    if args.max:
        todo = todo[:args.max]
    if args.list:
        for m, _ in todo:
            _say(f"{m.index:4d}  line {m.line:4d}  {m.what:28s} {m.source}")
        return 0
    env = dict(os.environ, PYTHONPYCACHEPREFIX=tempfile.mkdtemp(prefix="mutate-pyc-"))
    # a stop from outside (``timeout``, a terminal closed) unwinds like Ctrl-C, through the
    # ``finally`` that puts the module back
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    results: list[Mutant] = []
    try:
        path.write_text(ast.unparse(ast.parse(original)))
        outcome, seconds = _run_tests(args.tests, args.timeout, env)
        if outcome != "survived":
            _say(f"the tests fail ({outcome}) on the unmutated module as written back: fix "
                  f"that first", file=sys.stderr)
            return 2
        _say(f"baseline passes in {seconds:.1f} s; {len(todo)} mutants")
        for m, text in todo:
            path.write_text(text)
            m.outcome, m.seconds = _run_tests(args.tests, args.timeout, env)
            results.append(m)
            mark = "SURVIVED" if m.outcome == "survived" else m.outcome
            _say(f"{mark:9s} line {m.line:4d} {m.what:28s} {m.source}")
    finally:
        path.write_text(original)
    survivors = [m for m in results if m.outcome == "survived"]
    _say(f"\n{len(results) - len(survivors)} of {len(results)} killed; survivors:")
    for m in survivors:
        _say(f"  line {m.line:4d}  {m.what:28s} {m.source}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(m) for m in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
