"""Eval streams: named held-out streams of a recipe, served next to the training stream.

A recipe's ``eval:`` list names extra streams (issue 12 part 4). Each :class:`EvalStream` has
sources of its own and a fixed number of steps; everything else - tokenizer, ``seq_len``,
``lanes``, packing, shuffle, filters, ``bad_records`` - is the recipe's. :func:`eval_recipe`
turns a stream into a plain recipe (its sources, its batch and seed, no eval streams of its
own), so an eval stream *is* the ordinary lane engine on that recipe: deterministic and the
same global batch at every world size by construction. It always starts at step 0 (it has no
resume state, is never checkpointed and never enters the ledger) and yields exactly ``steps``
steps - padding once its data runs out, so that every evaluation has the same batch count.

The training stream's fingerprint does not cover the eval streams (:func:`training_view`): an
eval set can be added or changed during a run without refusing the run's checkpoints. Each
eval stream has a fingerprint of its own, the one of its :func:`eval_recipe`.

:class:`EvalStream`, :data:`INHERITED` and :func:`validate_streams` live in
:mod:`datalane.spec.recipe` (a recipe holds its streams and validates them) and are re-exported
here; this module imports the recipe one way.
"""

from __future__ import annotations

import dataclasses

from datalane.spec import recipe as _recipe
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import (
    EVAL_NAME_PATTERN as NAME_PATTERN,
)
from datalane.spec.recipe import INHERITED, TRAIN, EvalStream, stream_recipe, validate_streams

__all__ = [
    "INHERITED",
    "NAME_PATTERN",
    "TRAIN",
    "EvalStream",
    "check_stream",
    "eval_recipe",
    "eval_steps",
    "stream_names",
    "training_view",
    "validate_streams",
]



def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def stream_names(recipe: _recipe.Recipe) -> list[str]:
    """Every stream a client may open: ``train`` first, then the eval streams in order."""
    return [TRAIN, *(s.name for s in recipe.eval)]


def _described(recipe: _recipe.Recipe) -> str:
    names = stream_names(recipe)
    if len(names) == 1:
        return "the recipe has only the 'train' stream (no `eval:` streams)"
    return "the recipe's streams are " + ", ".join(repr(n) for n in names)


def check_stream(recipe: _recipe.Recipe, name: str) -> str:
    """The stream a client asks for by ``name``: ``train`` for ``""`` or ``"train"``, else the
    name of one of the recipe's eval streams; ConfigError naming ``name`` and listing the
    recipe's streams if it has none so named."""
    if name in ("", TRAIN):
        return TRAIN
    if any(s.name == name for s in recipe.eval):
        return name
    raise ConfigError(f"no stream is named {name!r}; {_described(recipe)}")


def eval_steps(recipe: _recipe.Recipe, name: str) -> int | None:
    """Steps of every evaluation of stream ``name``; None for the training stream (endless)."""
    name = check_stream(recipe, name)
    return None if name == TRAIN else next(s.steps for s in recipe.eval if s.name == name)


def eval_recipe(recipe: _recipe.Recipe, name: str) -> _recipe.Recipe:
    """Eval stream ``name`` of ``recipe`` as a plain recipe: the stream's sources, batch and
    seed, the recipe's :data:`INHERITED` fields, the defaults of every other field (no eval
    streams). ConfigError naming ``name`` and the recipe's streams if it has none so named."""
    stream = next((s for s in recipe.eval if s.name == name), None)
    if stream is None:
        what = ("'train' is the training stream, not an eval stream" if name == TRAIN
                else f"no eval stream is named {name!r}")
        raise ConfigError(f"{what}; {_described(recipe)}")
    return stream_recipe(recipe, stream)


def training_view(recipe: _recipe.Recipe) -> _recipe.Recipe:
    """The recipe without its eval streams: what the training stream's fingerprint covers."""
    if not recipe.eval:
        return recipe
    return dataclasses.replace(recipe, eval=[])
