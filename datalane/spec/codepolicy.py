"""Which modules a recipe's code may come from: one rule for every stream and every place.

A recipe names code: a filter predicate is an import path ``package.module:function`` that
the process reading the recipe imports and calls on every document, for the training sources
and the eval streams' sources alike. One rule, :class:`CodePolicy`, decides which modules
such code may come from, and every place that could import it applies that rule first:

* the operator's admission and its pod webhook, with the cluster policy's allow-list
  (Helm value ``recipes.predicateModules``);
* the sidecar, when it starts, with the allow-list the operator injects as
  ``$DATALANE_PREDICATE_MODULES`` (:data:`PREDICATE_MODULES_ENV`);
* the engine, before it imports a predicate (``datalane.engine.mapstage``): the loader's
  ``predicate_modules=``, else ``$DATALANE_PREDICATE_MODULES``, else no allow-list.

The rule:

* never a module of Python's standard library (``sys.stdlib_module_names``: ``builtins``,
  ``os``, ``subprocess``, ``importlib``, ``pickle``, ...): none of them is a document filter,
  and several run any code they are given (``builtins:exec``, ``os:system``). This holds with
  or without an allow-list;
* with an allow-list (module prefixes, whole dotted parts: ``corp.filters`` allows
  ``corp.filters`` and ``corp.filters.lang``, not ``corp.filtersx``), only modules under one
  of its entries; an empty allow-list allows no predicate at all;
* without one (a loader in the user's own process, a sidecar started by hand), any other
  module: the recipe is then as trusted as the code that runs it.

:func:`code_hooks` lists every hook of a recipe with its field, so a refusal names the field,
the predicate and the rule. Standard library only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from datalane.spec.errors import ConfigError
from datalane.spec.recipe import Recipe

__all__ = [
    "DENIED_MODULES",
    "PREDICATE_MODULES_ENV",
    "CodePolicy",
    "code_hooks",
    "parse_modules",
]

PREDICATE_MODULES_ENV = "DATALANE_PREDICATE_MODULES"
"""The allow-list of a process (comma-separated module prefixes; set but empty: none)."""

DENIED_MODULES = frozenset(sys.stdlib_module_names)
"""Top-level modules no predicate may come from: Python's standard library."""


def parse_modules(text: str) -> tuple[str, ...]:
    """Module prefixes from a comma-separated list (blanks ignored)."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


def code_hooks(recipe: Recipe, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(field, import path)`` of every piece of code ``recipe`` names: the filter
    predicates of the recipe, of its sources and of its eval streams' sources. ``prefix``
    goes before each field (``spec.recipe.`` for a DataPipeline)."""
    if recipe.filters is not None and recipe.filters.predicate:
        yield f"{prefix}filters.predicate", recipe.filters.predicate
    groups = [("sources", recipe.sources)]
    groups += [(f"eval[{k}].sources", stream.sources) for k, stream in enumerate(recipe.eval)]
    for where, sources in groups:
        for i, src in enumerate(sources):
            if src.filters is not None and src.filters.predicate:
                yield f"{prefix}{where}[{i}].filters.predicate", src.filters.predicate


@dataclass(frozen=True)
class CodePolicy:
    """The modules a process may import a recipe's code from (see the module docstring).

    ``modules`` None: no allow-list (only the standard library is refused). The other fields
    word a refusal: who keeps the allow-list (``origin``), where it is set (``setting``),
    what imports the code (``runner``) and what to do (``advice``)."""

    modules: tuple[str, ...] | None = None
    origin: str = "this loader"
    setting: str = "predicate_modules="
    runner: str = "this process"
    advice: str = "add its module to predicate_modules=, or drop the predicate"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CodePolicy:
        """The allow-list of ``$DATALANE_PREDICATE_MODULES`` (unset: none), as the operator
        injects it into a sidecar from the cluster policy."""
        env = os.environ if environ is None else environ
        raw = env.get(PREDICATE_MODULES_ENV)
        if raw is None:
            return cls()
        return cls(parse_modules(raw), "the cluster policy",
                   f"recipes.predicateModules, given as ${PREDICATE_MODULES_ENV}",
                   "the sidecar", "ask an administrator to add its module, or drop the "
                                  "predicate")

    @classmethod
    def of(cls, modules: Sequence[str] | None) -> CodePolicy:
        """The policy of a loader's ``predicate_modules=``: a list of module prefixes, or
        None for ``$DATALANE_PREDICATE_MODULES`` (unset: no allow-list)."""
        if modules is None:
            return cls.from_env()
        if isinstance(modules, str) or not all(isinstance(m, str) and m for m in modules):
            raise ConfigError(f"predicate_modules must be a list of module prefixes, got "
                              f"{modules!r}")
        return cls(tuple(modules))

    def allows(self, module: str) -> bool:
        if module.split(".", 1)[0] in DENIED_MODULES:
            return False
        return self.modules is None or any(module == p or module.startswith(p + ".")
                                           for p in self.modules)

    def check(self, where: str, path: str) -> None:
        """ConfigError naming ``where`` and ``path`` if its module is not allowed."""
        module = path.partition(":")[0]
        if self.allows(module):
            return
        top = module.split(".", 1)[0]
        if top in DENIED_MODULES:
            raise ConfigError(
                f"{where} {path!r} is not allowed: {top!r} is a module of Python's standard "
                f"library, which no filter predicate may come from (builtins:exec or "
                f"os:system would run any code the data holds); write the filter in a module "
                f"of your own")
        allowed = (f"only from the modules {', '.join(self.modules)}" if self.modules
                   else "from no module")
        raise ConfigError(f"{where} {path!r} is not allowed: {self.origin} admits predicates "
                          f"{allowed} ({self.setting}). A predicate is code {self.runner} "
                          f"imports and runs; {self.advice}")

    def check_recipe(self, recipe: Recipe, prefix: str = "") -> None:
        """:meth:`check` every hook of ``recipe`` (training and eval sources)."""
        for where, path in code_hooks(recipe, prefix):
            self.check(where, path)
