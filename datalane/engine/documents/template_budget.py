"""The budget of one chat-template render: what it may still do, and the values it may print.

Each render (:func:`datalane.engine.documents.template_sandbox.render`) sets a fresh
:class:`Budget` in a context variable, so each thread renders with its own; the sandbox's
hooks (:mod:`.template_sandbox`, :mod:`.template_growth`) charge it through :func:`current`.
A render that goes past a bound raises :class:`TemplateLimitError`; one that would print a
value without a fixed text (:func:`printed_size`) raises :class:`NondeterministicOutput`. The
bounds are documented in docs/chat.md. Outside a render (Jinja folding constants while it
compiles a template) :func:`current` raises ``Impossible``, so the value is left to the
render.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import jinja2
from jinja2 import nodes

from datalane.spec.limits import MAX_RECORD_BYTES

__all__ = ["MAX_ALLOCATED", "MAX_CALL_DEPTH", "MAX_CHARS", "MAX_INT_BITS", "MAX_ITEMS",
           "MAX_STEPS", "RENDER_SECONDS", "Budget", "NondeterministicOutput",
           "TemplateLimitError", "bounded_iter", "bounded_scan", "check_chars", "check_items",
           "current", "printed", "printed_size", "rendering", "scan_steps", "tick",
           "too_long", "too_many"]

MAX_STEPS = 1 << 20
"""Steps of one render (1,048,576; ChatML and Llama 3 take about 10 a message)."""
RENDER_SECONDS = 10.0
"""Wall-clock seconds of one render: a backstop for steps that are slow one by one."""
MAX_CHARS = MAX_RECORD_BYTES
"""Characters of one string a template makes, and of its output (64 Mi: a rendered
conversation may be as large as the largest record a reader accepts)."""
MAX_ITEMS = 1 << 20
"""Items of one list, tuple or dict a template makes (1,048,576)."""
MAX_ALLOCATED = 1 << 28
"""Characters and items of all the values one render makes (256 Mi)."""
MAX_INT_BITS = 1 << 16
"""Bits of an integer a template makes (65,536: 19,728 decimal digits)."""
MAX_CALL_DEPTH = 64
"""Nested calls of one render."""
_CLOCK_STEPS = 16


class TemplateLimitError(jinja2.exceptions.TemplateRuntimeError):
    """A render went past one of the bounds of :mod:`.template_budget`."""


class NondeterministicOutput(jinja2.exceptions.TemplateRuntimeError):
    """A render would print a value whose text is not the same on every run."""


# -- the budget of the render in progress ----------------------------------------------------

class Budget:
    """What is left to one render; each thread renders with its own (a context variable)."""

    __slots__ = ("chars", "clock", "deadline", "depth", "steps")

    def __init__(self) -> None:
        self.steps = MAX_STEPS
        self.clock = MAX_STEPS - _CLOCK_STEPS  # the step count at which to read the clock
        self.chars = MAX_ALLOCATED
        self.depth = 0
        self.deadline = time.monotonic() + RENDER_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps -= n
        if self.steps < self.clock:
            if self.steps < 0:
                raise TemplateLimitError(f"the template took more than {MAX_STEPS:,} steps "
                                         f"(loop iterations, calls, lookups, operators)")
            self.clock = self.steps - _CLOCK_STEPS
            if time.monotonic() > self.deadline:
                raise TemplateLimitError(f"the template ran for more than {RENDER_SECONDS:g} "
                                         f"s")

    def made(self, value: Any) -> Any:
        """Count what an operation made against the bounds; ``value`` unchanged."""
        if type(value) is str or isinstance(value, (str, bytes)):
            n = len(value)
            if n > MAX_CHARS:
                raise too_long(n)
        elif isinstance(value, (list, tuple, dict)):
            n = len(value)
            if n > MAX_ITEMS:
                raise too_many(n)
        elif isinstance(value, (set, frozenset)):
            raise NondeterministicOutput("the template made a set, whose order differs "
                                         "between runs")
        elif isinstance(value, int):
            if value.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"the template made an integer of more than "
                                         f"{MAX_INT_BITS:,} bits")
            return value
        else:
            return value
        self.spend(n)
        return value

    def spend(self, n: int) -> None:
        self.chars -= n
        if self.chars < 0:
            raise TemplateLimitError(f"the template made more than {MAX_ALLOCATED:,} "
                                     f"characters and items in all")


_BUDGET: ContextVar[Budget | None] = ContextVar("datalane_template_budget", default=None)
_get = _BUDGET.get


@contextmanager
def rendering() -> Iterator[Budget]:
    """A fresh budget for the render run inside the block (in this thread)."""
    budget = Budget()
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def tick(chars: int = 0) -> None:
    """One step of the running render that made ``chars`` characters: the hot path of the
    hooks, in one call."""
    budget = _get()
    if budget is None:
        raise nodes.Impossible()
    budget.steps -= 1
    budget.chars -= chars
    if budget.steps < budget.clock or budget.chars < 0:
        budget.step(0)
        budget.spend(0)


def current() -> Budget:
    """The running render's budget; outside a render (Jinja folding constants while it
    compiles) nothing may run, so the value is left to the render."""
    budget = _get()
    if budget is None:
        raise nodes.Impossible()
    return budget


def too_long(n: int) -> TemplateLimitError:
    return TemplateLimitError(f"the template would make a string of {n:,} characters, more "
                              f"than {MAX_CHARS:,}")


def too_many(n: int) -> TemplateLimitError:
    return TemplateLimitError(f"the template would make {n:,} items, more than {MAX_ITEMS:,}")


def check_chars(n: int) -> None:
    if n > MAX_CHARS:
        raise too_long(n)


def check_items(n: int) -> None:
    if n > MAX_ITEMS:
        raise too_many(n)


# -- what may be printed ---------------------------------------------------------------------

_SCALARS = (bool, int, float, type(None))
_STEPS_PER_ITEM = 4  # looking at an item to print it costs a few loop iterations
_CONTAINERS = (list, tuple, dict)


def printed_size(value: Any, budget: Budget, *, as_json: bool = False,
                 ascii_only: bool = False, indent: int = 0) -> int:
    """An upper bound of ``len(str(value))`` (``as_json``: of ``json.dumps(value)`` with
    ``ensure_ascii=ascii_only`` and ``indent``); raises :class:`NondeterministicOutput` for
    a value (or a part of one) without a fixed text. One step per value looked at; stops
    once the bound passes :data:`MAX_CHARS`."""
    if type(value) is str and not as_json:
        return len(value)
    total = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    budget.step()
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if as_json:
                total += 12 * len(v) + 2 if ascii_only else _json_len(v)
            elif depth:
                total += (2 * len(v) if v.isprintable() else 10 * len(v)) + 3  # repr
            else:
                total += len(v)
        elif isinstance(v, _SCALARS):
            total += v.bit_length() // 3 + 2 if type(v) is int else 24
        elif isinstance(v, jinja2.Undefined):
            total += 9
        elif type(v) in _CONTAINERS:
            if depth >= MAX_CALL_DEPTH:
                raise TemplateLimitError(f"the template prints a value nested deeper than "
                                         f"{MAX_CALL_DEPTH} levels")
            budget.step(1 + _STEPS_PER_ITEM * len(v))
            items = v.items() if isinstance(v, dict) else ((None, x) for x in v)
            total += 2 + (depth * indent + 1 if indent else 0)
            for key, item in items:
                if key is not None:
                    stack.append((key, depth + 1))
                stack.append((item, depth + 1))
                total += 4 + ((depth + 1) * indent + 1 if indent else 0)
        else:
            raise NondeterministicOutput(
                f"the template prints a {type(v).__name__}, whose text is not the same on "
                f"every run (only strings, numbers, booleans, none and lists and mappings of "
                f"them are printed)")
        if total > MAX_CHARS:
            raise too_long(total)
    return total


_CONTROLS = dict.fromkeys(range(32))


def _json_len(s: str) -> int:
    """Upper bound of ``len(json.dumps(s, ensure_ascii=False))``: a control character is
    at most 6 (``\\u001f``), a quote or backslash 2."""
    if len(s) < 1 << 16:
        return 6 * len(s) + 2
    controls = len(s) - len(s.translate(_CONTROLS))
    return len(s) + 2 + s.count('"') + s.count("\\") + 5 * controls


def printed(*values: Any) -> int:
    budget = current()
    return sum(printed_size(v, budget) for v in values)


def bounded_iter(iterable: Any) -> Iterator[Any]:
    """What a ``{% for %}`` loop iterates: one step an item."""
    return _counted(iter(iterable), current())


def _counted(items: Iterator[Any], budget: Budget) -> Iterator[Any]:
    for item in items:
        budget.step()
        yield item


def bounded_scan(value: Any) -> Any:
    """The right side of ``in``: a step per 4,096 characters or 16 items it holds (``in``
    compares them one by one)."""
    budget = current()
    budget.step(1 + scan_steps(value))
    return value


def scan_steps(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) >> 12
    return len(value) >> 4 if isinstance(value, (list, tuple)) else 0
