"""Growth of a chat template's values, bounded before each operation runs.

An operation that makes a value from others (``'a' * n``, ``s.center(n)``, ``x | indent(n)``,
``'%10000000000s' % x``, ``[x] | batch(n, 0)``) is refused when its result would pass a bound
of :mod:`.template_budget`, computed from its operands' sizes before it runs, so a template
never holds the memory it asks for. :func:`binop_size` covers the arithmetic operators,
:func:`call_args` the methods of strings, integers and dicts, :func:`bounded_filter` /
:func:`bounded_test` wrap Jinja's filters and tests (a filter that turns its input into text
takes printable values only), :func:`bounded_join` / :func:`bounded_sum` replace Jinja's
``join`` and ``sum``, and :class:`BoundedFormatter` is ``str.format``'s. Callers:
:mod:`.template_sandbox`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jinja2
import jinja2.filters
import jinja2.sandbox
from jinja2.utils import _PassArg

from datalane.engine.documents.template_budget import (
    MAX_INT_BITS,
    MAX_ITEMS,
    TemplateLimitError,
    bounded_iter,
    check_chars,
    check_items,
    current,
    printed,
    printed_size,
    scan_steps,
    too_many,
)

__all__ = ["SLOW_FILTER_CHARS", "BoundedEscapeFormatter", "BoundedFormatter", "binop_size",
           "bounded_filter", "bounded_join", "bounded_sum", "bounded_test", "call_args"]

SLOW_FILTER_CHARS = 1 << 20
"""Characters of the input of a filter that works on it in Python code, not one C call
(``wordwrap``, ``urlize``, ``pprint``, ``xmlattr``): 1 Mi."""


# -- operators and methods ------------------------

_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
_WIDTH = re.compile(r"\d+")


def _percent_size(fmt: Any, args: Any) -> int:
    """Upper bound of ``fmt % args`` (a ``*`` width is refused: its size is an argument)."""
    if isinstance(fmt, (bytes, bytearray)):
        fmt = fmt.decode("latin-1")
    total = len(fmt)
    for width, precision, _ in _PERCENT.findall(fmt):
        if "*" in (width, precision):
            raise TemplateLimitError("a '*' width in a %-format is not supported")
        total += int(width or 0) + int(precision or 0) + 32
        check_chars(total)
    total += 10 * printed(args)
    check_chars(total)
    return total


def _int_bits(n: int) -> int:
    return abs(n).bit_length()


def binop_size(op: str, left: Any, right: Any) -> None:
    """Refuse ``left op right`` if its result would pass a bound."""
    if op == "*":
        if isinstance(left, int) and not isinstance(right, int):
            left, right = right, left
        if isinstance(right, int):
            if isinstance(left, (str, bytes)):
                check_chars(len(left) * max(right, 0))
            elif isinstance(left, (list, tuple)):
                check_items(len(left) * max(right, 0))
            elif isinstance(left, int) and _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
                raise TemplateLimitError(f"the template would make an integer of more than "
                                         f"{MAX_INT_BITS:,} bits")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and right * _int_bits(left) > MAX_INT_BITS + right:
            raise TemplateLimitError(f"the template would make an integer of more than "
                                     f"{MAX_INT_BITS:,} bits")
    elif op == "+":
        if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
            check_chars(len(left) + len(right))
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            check_items(len(left) + len(right))
    elif op == "%" and isinstance(left, (str, bytes)):
        _percent_size(left, right)


def _occurrences(s: Any, old: Any, count: Any) -> int:
    n = len(s) + 1 if not old else s.count(old)
    return min(n, count) if isinstance(count, int) and count >= 0 else n


_LINE_BREAKS = dict.fromkeys(map(ord, "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))


def _str_method(owner: Any, name: str, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Refuse a call of a string (or bytes) method whose result would pass a bound; the
    arguments to call it with (``join`` gets its parts as a list). A step per 4,096
    characters of the string: most methods read it all."""
    n = len(owner)
    current().step(n >> 12)

    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("center", "ljust", "rjust", "zfill"):
        width = arg(0, "width", 0)
        if isinstance(width, int):
            check_chars(width)
    elif name == "expandtabs":
        size = arg(0, "tabsize", 8)
        if isinstance(size, int):
            tab = "\t" if isinstance(owner, str) else b"\t"
            check_chars(n + owner.count(tab) * max(size, 0))
    elif name == "replace":
        old, new = arg(0, "old", ""), arg(1, "new", "")
        if isinstance(old, type(owner)) and isinstance(new, type(owner)):
            check_chars(n + _occurrences(owner, old, arg(2, "count", -1))
                         * (len(new) - len(old)))
    elif name == "join" and args:
        parts = list(bounded_iter(args[0]))
        check_items(len(parts))
        check_chars(sum(len(p) for p in parts if isinstance(p, (str, bytes)))
                     + n * max(len(parts) - 1, 0))
        return (parts,)
    elif name in ("split", "rsplit") and n >= MAX_ITEMS:
        limit = arg(1, "maxsplit", -1)
        if not isinstance(limit, int) or limit < 0 or limit > MAX_ITEMS:
            sep = arg(0, "sep", None)
            if len(getattr(owner, name)(sep, MAX_ITEMS)) > MAX_ITEMS:
                raise too_many(MAX_ITEMS + 1)
    elif name == "splitlines" and n >= MAX_ITEMS and isinstance(owner, str):
        check_items(n - len(owner.translate(_LINE_BREAKS)) + 1)
    elif name in ("upper", "lower", "title", "capitalize", "swapcase", "casefold"):
        check_chars(3 * n)  # Unicode case mappings make at most 3 characters of one
    elif name == "encode":
        check_chars(4 * n)
    elif name == "translate" and isinstance(owner, str):
        table = arg(0, "table", None)
        if isinstance(table, Mapping):
            longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
            check_chars(n * max(longest, 1))
    return args


def call_args(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Refuse a call whose result would pass a bound, from the callee and its arguments."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes)):
        return _str_method(owner, name, args, kwargs)
    if isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int):
            check_chars(length)
    elif name == "fromkeys" and args and hasattr(args[0], "__len__"):
        check_items(len(args[0]))
    elif name == "strftime_now" and args and isinstance(args[0], str):
        check_chars(12 * len(args[0]))  # "%c": 24 characters for 2
    return args


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, key: str,
         default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


def _text_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else printed(value)


def _bound_indent(s: Any, *args: Any, **kwargs: Any) -> None:
    width = _arg(args, kwargs, 0, "width", 4)
    w = width if isinstance(width, int) else _text_len(width)
    lines = (s.count("\n") if isinstance(s, str) else _text_len(s)) + 1
    check_chars(_text_len(s) + lines * max(w, 0))


def _bound_replace(s: Any, *args: Any, **kwargs: Any) -> None:
    old, new = str(_arg(args, kwargs, 0, "old", "")), str(_arg(args, kwargs, 1, "new", ""))
    text = s if isinstance(s, str) else str(s)
    check_chars(len(text) + _occurrences(text, old, _arg(args, kwargs, 2, "count", None))
                 * (len(new) - len(old)))


def _bound_slow(s: Any, *args: Any, **kwargs: Any) -> None:
    n = _text_len(s)
    if n > SLOW_FILTER_CHARS:
        raise TemplateLimitError(f"the template passes {n:,} characters to a filter that "
                                 f"takes at most {SLOW_FILTER_CHARS:,}")
    extra = sum(_text_len(v) for v in (*args, *kwargs.values()) if isinstance(v, str))
    check_chars((n + 1) * (64 + extra))


def _bound_batch(value: Any, linecount: Any = None, fill_with: Any = None) -> None:
    if fill_with is not None and isinstance(linecount, int):
        check_items(linecount)


def _bound_slice(value: Any, slices: Any = None, fill_with: Any = None) -> None:
    if isinstance(slices, int):
        check_items(slices)


def _bound_list(value: Any) -> None:
    if isinstance(value, str):
        check_items(len(value))


def _bound_center(value: Any, width: Any = 80) -> None:
    if isinstance(width, int):
        check_chars(max(_text_len(value), width))


def _bound_format(value: Any, *args: Any, **kwargs: Any) -> None:
    _percent_size(str(value), kwargs or args)


def _bound_tojson(value: Any, *args: Any, **kwargs: Any) -> None:
    indent = _arg(args, kwargs, 1, "indent", None)
    width = indent if isinstance(indent, int) else 0 if indent is None else _text_len(indent)
    ascii_only = bool(_arg(args, kwargs, 0, "ensure_ascii", False))
    check_chars(printed_size(value, current(), as_json=True, ascii_only=ascii_only,
                              indent=max(width, 0)))


# filters whose inputs become text (checked printable) -> the bound of their result: a factor
# of the inputs' text (Unicode case mappings make at most 3 characters of one, an HTML escape
# 6, a URL escape 12) or a function of their arguments
_STRINGIFYING: dict[str, int | Callable[..., None]] = {
    "string": 1, "safe": 1, "trim": 1, "striptags": 1, "wordcount": 1, "truncate": 1,
    "capitalize": 3, "lower": 3, "upper": 3, "title": 3, "e": 6, "escape": 6,
    "forceescape": 6, "urlencode": 12, "center": _bound_center, "indent": _bound_indent,
    "replace": _bound_replace,
    "format": _bound_format, "wordwrap": _bound_slow, "urlize": _bound_slow,
    "pprint": _bound_slow, "xmlattr": _bound_slow,
}
_GROWING: dict[str, int | Callable[..., None]] = {
    "batch": _bound_batch, "slice": _bound_slice, "list": _bound_list,
    "tojson": _bound_tojson,
}


@jinja2.pass_eval_context
def bounded_join(eval_ctx: Any, value: Iterable[Any], d: str = "",
                  attribute: str | int | None = None) -> str:
    """Jinja's ``join`` (no autoescape: a chat template's environment has none), counted."""
    if attribute is not None:
        value = map(jinja2.filters.make_attrgetter(eval_ctx.environment, attribute), value)
    items = list(bounded_iter(value))
    check_items(len(items))
    check_chars(printed(*items) + len(str(d)) * max(len(items) - 1, 0))
    return str(d).join(map(str, items))


@jinja2.pass_environment
def bounded_sum(environment: Any, iterable: Iterable[Any],
                 attribute: str | int | None = None, start: Any = 0) -> Any:
    """Jinja's ``sum``; a sum of lists adds one at a time, each sum counted."""
    if isinstance(start, (int, float)):
        return jinja2.filters.do_sum(environment, iterable, attribute, start)
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(environment, attribute), iterable)
    total = start
    for item in bounded_iter(iterable):
        binop_size("+", total, item)
        total = current().made(total + item)
    return total


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` counted: a step, its inputs printable if it turns them into text, its result
    bounded before it runs (a factor of its inputs' text, or a function of its arguments)
    and counted after."""
    rule = _STRINGIFYING.get(name, _GROWING.get(name))
    stringifies = name in _STRINGIFYING
    factor = rule if isinstance(rule, int) else 0
    bound = None if isinstance(rule, int) else rule
    skip = 1 if _PassArg.from_obj(func) is not None else 0

    @functools.wraps(func)  # keeps jinja_pass_arg
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.step()
        if stringifies:
            size = sum(len(v) if type(v) is str else printed_size(v, budget)
                       for v in (*args[skip:], *kwargs.values()))
            check_chars(factor * size)
        if bound is not None:
            bound(*args[skip:], **kwargs)
        return budget.made(func(*args, **kwargs))

    return bounded


def bounded_test(name: str, func: Any) -> Callable[..., Any]:
    scans = name == "in"

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        current().step(1 + (scan_steps(args[-1]) if scans and args else 0))
        return func(*args, **kwargs)

    return bounded


class BoundedFormatter(jinja2.sandbox.SandboxedFormatter):
    """``str.format`` fields: printable values, widths within the bounds."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        printed(value)
        check_chars(max(map(int, _WIDTH.findall(format_spec)), default=0))
        return current().made(super().format_field(value, format_spec))


class BoundedEscapeFormatter(BoundedFormatter, jinja2.sandbox.SandboxedEscapeFormatter):
    pass
