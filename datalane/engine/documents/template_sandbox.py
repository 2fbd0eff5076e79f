"""The sandbox chat templates run in: bounded in work, size and depth, and deterministic.

A chat template is data from the Hub or a recipe, so it may be hostile: Jinja's sandbox keeps
it from Python's internals, but not from looping 10^10 times, from ``'a' * 10**10``, or from
printing an object's address (``{{ cycler() }}``), which differs between two runs and so
would change the stream. :class:`BoundedSandbox` is ``transformers``' immutable sandbox with
bounds checked in its own hooks, and :func:`compile_template` / :func:`render` are the only
way datalane compiles and renders a chat template. A template that would exceed a bound stops
with ``TemplateLimitError`` (the conversation is a bad record, reason ``chat_template``); a
template that would print something without a fixed text stops with
``NondeterministicOutput``; the same template on the same conversation stops at the
same point on every run, except for the wall-clock bound (a backstop no render that keeps
the other bounds comes near).

Bounds of one render (one call of :func:`render`; a conversation is 1 + 2 x its assistant
turns renders, and stops at the first that fails), in :mod:`.template_budget` and
docs/chat.md: steps (loop iterations, calls, lookups, operators, filters, tests, values
looked at to print them), wall-clock time (read every 16 steps), the characters of each
string and of the output, the items of each list, the bits of an integer, all that is made,
nested calls. Each operation that can grow a value (``*``, ``+``, ``**``, ``%``, ``~``,
``str.format``, string methods with a width or a replacement, filters such as ``join``,
``replace``, ``center``, ``indent``, ``batch``) is checked *before* it runs, from its
operands' sizes (:mod:`.template_growth`). Loops, ``~`` and the right side of ``in`` go
through filters no template can name (:func:`compile_template` rewrites its syntax tree),
and every output buffer is bounded (:class:`_CodeGenerator`).

Determinism: only strings, numbers, booleans, None, undefined values and lists, tuples and
dicts of them are printed (``{{ x }}``, ``~``, ``%``, ``format``, ``join``, ``string`` and every
filter that turns its input into text); anything else (an iterator, a function, a cycler)
stops the render. Sets (``keys() - other``) have no fixed order and stop it too. At load,
:func:`check_determinism` refuses the ``random`` filter and ``lipsum`` however they are
reached: a filter or test named through ``map`` / ``select`` / ``reject`` / ``selectattr`` /
``rejectattr`` must be a string constant (not ``random``), and they are absent from the
environment besides. Callers: :mod:`datalane.engine.documents.chat_template`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.sandbox
import jinja2.utils
import jinja2.visitor
from jinja2 import nodes
from markupsafe import Markup

from datalane.engine.documents.template_budget import (
    MAX_CALL_DEPTH,
    MAX_CHARS,
    TemplateLimitError,
    bounded_iter,
    bounded_scan,
    check_chars,
    current,
    printed,
    printed_size,
    rendering,
    tick,
)
from datalane.engine.documents.template_growth import (
    BoundedEscapeFormatter,
    BoundedFormatter,
    binop_size,
    bounded_filter,
    bounded_join,
    bounded_sum,
    bounded_test,
    call_args,
)
from datalane.spec.errors import ConfigError

__all__ = ["MAX_TEMPLATE_CHARS", "REFUSED_FILTERS", "REFUSED_GLOBALS", "BoundedSandbox",
           "check_determinism", "compile_template", "render"]

MAX_TEMPLATE_CHARS = 1 << 20
"""Characters of a template's text (1 MiB; the templates of the Hub are under 64 KiB)."""
REFUSED_FILTERS = frozenset({"random"})
REFUSED_GLOBALS = frozenset({"lipsum"})
# filters that call another filter or test by name: (position of the name, what it names)
_NAMING = {"map": (0, "filter"), "select": (0, "test"), "reject": (0, "test"),
           "selectattr": (1, "test"), "rejectattr": (1, "test")}


# -- output -----------------------------------------------------------------------------------

def _finalize(value: Any) -> Any:
    """``{{ value }}``: only values with a fixed text are printed."""
    if type(value) is not str:
        printed_size(value, current())
    return value


def bounded_concat(values: tuple[Any, ...]) -> str:
    """``a ~ b ~ c``."""
    check_chars(printed(*values))
    text = "".join([str(v) for v in values])
    current().made(text)
    return text


# filters no template can name (not identifiers): loops, "~" and "in" go through them
_ITER, _CONCAT, _SCAN = "datalane iter", "datalane concat", "datalane scan"


class _Buffer(list[Any]):
    """The output of a macro, call, filter or set block, bounded as the template's output."""

    __slots__ = ("size",)

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def _grow(self, n: int) -> None:
        self.size += n
        check_chars(self.size)
        tick(n)

    def append(self, piece: Any) -> None:
        self._grow(len(piece) if isinstance(piece, str) else 0)
        list.append(self, piece)

    def extend(self, pieces: Iterable[Any]) -> None:
        pieces = tuple(pieces)
        self._grow(sum(len(p) for p in pieces if isinstance(p, str)))
        list.extend(self, pieces)


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator with every output buffer a :class:`_Buffer`."""

    def buffer(self, frame: jinja2.compiler.Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.bounded_buffer()")


# -- the environment ---------------------------------------------------------------------------

class BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """``transformers``' immutable sandbox with every hook counting against the render's
    budget: calls, attribute and item lookups, all arithmetic operators, filters and tests,
    ``{% for %}`` items (:func:`compile_template` routes loops and ``~`` through
    :func:`bounded_iter` / :func:`bounded_concat` / :func:`bounded_scan`), output buffers
    and printed values."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "**", "%"})
    code_generator_class = _CodeGenerator
    bounded_buffer = _Buffer

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, **options)
        for name in REFUSED_FILTERS:
            self.filters.pop(name, None)
        for name in REFUSED_GLOBALS:
            self.globals.pop(name, None)
        self.filters["join"] = bounded_join
        self.filters["sum"] = bounded_sum

    def bound_functions(self) -> None:
        """Wrap every filter and test (call once the template's own are registered)."""
        for name, func in list(self.filters.items()):
            self.filters[name] = bounded_filter(name, func)
        for name, func in list(self.tests.items()):
            self.tests[name] = bounded_test(name, func)
        self.filters.update({_ITER: bounded_iter, _CONCAT: bounded_concat,
                             _SCAN: bounded_scan})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any,
                   right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str:  # the common one
            n = len(left) + len(right)
            check_chars(n)
            tick(n)
            return left + right
        budget = current()
        budget.step()
        binop_size(operator, left, right)
        return budget.made(self.binop_table[operator](left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        value = super().getitem(obj, argument)
        return current().made(value) if isinstance(argument, slice) else value

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if super().wrap_str_format(value) is None:
            return None
        f_self = value.__self__
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"
        formatter: BoundedFormatter
        if isinstance(f_self, Markup):
            formatter = BoundedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = BoundedFormatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:  # as Jinja's own wrapper
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} "
                                    f"given)")
                kwargs, args = args[0], ()
            text: str = str_type(formatter.vformat(f_self, args, kwargs))
            return text

        return functools.update_wrapper(wrapper, value)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any,
             **kwargs: Any) -> Any:
        budget = current()
        budget.step()
        if not __self.is_safe_callable(__obj):
            raise jinja2.exceptions.SecurityError(f"{type(__obj).__name__} is not safely "
                                                  f"callable")
        args = call_args(__obj, args, kwargs)
        budget.depth += 1
        try:
            if budget.depth > MAX_CALL_DEPTH:
                raise TemplateLimitError(f"the template nests more than {MAX_CALL_DEPTH} "
                                         f"calls")
            return budget.made(__context.call(__obj, *args, **kwargs))
        finally:
            budget.depth -= 1


# -- loading and rendering -----------------------------------------------------------------------

def check_determinism(ast: nodes.Template, origin: str) -> None:
    """Refuse a template that could render differently on two runs: the ``random`` filter,
    ``lipsum``, or a filter or test named by a value only known at render."""
    for node in ast.find_all((nodes.Filter, nodes.Test)):
        if isinstance(node, nodes.Filter) and node.name in REFUSED_FILTERS:
            raise ConfigError(f"{origin} uses the {node.name!r} filter (line {node.lineno}); "
                              f"a datalane stream must be the same on every run")
        if node.name not in _NAMING or not isinstance(node, nodes.Filter):
            continue
        index, what = _NAMING[node.name]
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            raise ConfigError(f"{origin} passes *args or **kwargs to {node.name} (line "
                              f"{node.lineno}): the {what} it names must be a string "
                              f"constant, so that it is known when the template is loaded")
        if node.name == "map" and any(k.key == "attribute" for k in node.kwargs):
            continue
        if len(node.args) <= index:
            continue
        named = node.args[index]
        if not isinstance(named, nodes.Const) or not isinstance(named.value, str):
            raise ConfigError(f"{origin} names the {what} of {node.name} with an expression "
                              f"(line {node.lineno}); name it with a string constant, so "
                              f"that it is known when the template is loaded")
        if what == "filter" and named.value in REFUSED_FILTERS:
            raise ConfigError(f"{origin} uses the {named.value!r} filter through {node.name} "
                              f"(line {node.lineno}); a datalane stream must be the same on "
                              f"every run")
    for name in ast.find_all(nodes.Name):
        if name.name in REFUSED_GLOBALS:
            raise ConfigError(f"{origin} uses {name.name}() (line {name.lineno}), which is "
                              f"random; a datalane stream must be the same on every run")


def _hidden(name: str, node: nodes.Node) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Bounding(jinja2.visitor.NodeTransformer):
    """Loops iterate through :func:`bounded_iter`, ``~`` joins through
    :func:`bounded_concat`, the right side of ``in`` passes :func:`bounded_scan`."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)  # in place
        node.iter = _hidden(_ITER, node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _hidden(_CONCAT, nodes.Tuple(list(node.nodes), "load", lineno=node.lineno))

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        for operand in node.ops:
            if operand.op in ("in", "notin"):
                operand.expr = _hidden(_SCAN, operand.expr)
        return node


def compile_template(env: BoundedSandbox, text: str, origin: str) -> jinja2.Template:
    """The template ``text``, checked (:func:`check_determinism`) and compiled with its loops
    and concatenations bounded; a ConfigError naming ``origin`` if it is not a template."""
    if len(text) > MAX_TEMPLATE_CHARS:
        raise ConfigError(f"{origin} is {len(text):,} characters long; a chat template may "
                          f"have at most {MAX_TEMPLATE_CHARS:,}")
    try:
        ast = env.parse(text)
        check_determinism(ast, origin)
        bounded = _Bounding().visit(ast)
        bounded.set_environment(env)
        return env.from_string(bounded)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"{origin} is not a valid Jinja template: {e.message} "
                          f"(line {e.lineno})") from e
    except (RecursionError, SyntaxError, MemoryError) as e:  # Python's own limits on nesting
        raise ConfigError(f"{origin} is nested too deeply to compile: "
                          f"{type(e).__name__}: {e}"[:300]) from None


def render(template: jinja2.Template, context: jinja2.runtime.Context) -> str:
    """The output of ``template`` in ``context``, within the bounds of one render."""
    with rendering():
        out: list[str] = []
        size = 0
        for piece in template.root_render_func(context):
            size += len(piece)
            if size > MAX_CHARS:
                raise TemplateLimitError(f"the template's output passed {MAX_CHARS:,} "
                                         f"characters")
            out.append(piece)
        return "".join(out)
