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

This module refers to :mod:`datalane.spec.recipe` (and it to this one) through the module,
not its names, so that either can be imported first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from datalane.spec import recipe as _recipe
from datalane.spec.errors import ConfigError
from datalane.spec.model import doc

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

NAME_PATTERN = r"[a-z0-9]([a-z0-9_-]{0,62})?"
"""Stream names: the pattern of source names (:mod:`datalane.spec.recipe`)."""

TRAIN = "train"
"""The name of the training stream (what an Open request's empty ``stream`` means)."""

INHERITED = ("lanes", "seq_len", "tokenizer", "filters", "packing", "shuffle", "bad_records",
             "bad_records_max_fraction", "version")
"""The recipe fields an eval stream takes from its recipe. ``sources``, ``global_batch_size``
and ``seed`` come from the stream; every other field (``eval``, and any field about the
training run's course) keeps its default in :func:`eval_recipe`."""


@dataclass(frozen=True)
class EvalStream:
    """A named eval stream: its own sources, read as the recipe's, for a fixed count of steps."""

    name: str = doc(
        "Unique name of the stream (lowercase letters, digits, '-', '_'); a client opens it "
        "with `stream=` this name. `train` names the training stream and is refused.",
        pattern=NAME_PATTERN)
    sources: list[_recipe.Source] = doc(
        "The stream's sources, mixed by their weights as the recipe's sources are, read with "
        "the recipe's tokenizer, filters, packing and shuffle. A training source may be an "
        "eval source too (the data is then not held out).", min_items=1)
    steps: int = doc(
        "Steps (global batches) of every evaluation: exactly this many, padded with "
        "`ended` set once the stream's data runs out.", ge=1)
    global_batch_size: int | None = doc(
        "Sequences per eval step; null means the recipe's. A multiple of `lanes`.",
        default=None, ge=1)
    seed: int | None = doc("Seed of the stream's permutations; null means the recipe's.",
                           default=None, ge=0)

    def validate(self, where: str) -> None:
        if self.name == TRAIN:
            raise ConfigError(f"{_at(where, 'name')} {TRAIN!r} names the training stream; give "
                              f"the eval stream another name")


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
    return _build(recipe, stream)


def _build(recipe: _recipe.Recipe, stream: EvalStream) -> _recipe.Recipe:
    fields: dict[str, Any] = {f: getattr(recipe, f) for f in INHERITED}
    fields["sources"] = list(stream.sources)
    fields["global_batch_size"] = (stream.global_batch_size
                                   if stream.global_batch_size is not None
                                   else recipe.global_batch_size)
    fields["seed"] = stream.seed if stream.seed is not None else recipe.seed
    return _recipe.Recipe(**fields)


def validate_streams(recipe: _recipe.Recipe, where: str) -> None:
    """Check the recipe's eval streams: unique names, and each stream's recipe valid (its
    batch a multiple of lanes, within the limits; its source names unique; ...), errors
    naming the field as ``eval[i].<field>``."""
    seen: set[str] = set()
    for i, stream in enumerate(recipe.eval):
        at = _at(where, f"eval[{i}]")
        if stream.name in seen:
            raise ConfigError(f"{at}.name {stream.name!r} is used by another eval stream; "
                              f"names must be unique")
        seen.add(stream.name)
        _build(recipe, stream).validate(at)


def training_view(recipe: _recipe.Recipe) -> _recipe.Recipe:
    """The recipe without its eval streams: what the training stream's fingerprint covers."""
    if not recipe.eval:
        return recipe
    return dataclasses.replace(recipe, eval=[])
