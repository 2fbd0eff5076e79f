"""One code policy for every stream: the engine refuses a filter predicate from
Python's standard library, or from a module outside its allow-list, for training and eval
sources alike, before it imports anything.

The tester's repro: an eval source with ``filters.predicate: builtins:exec`` ran 40 eval
documents through ``exec``. Here the documents are code that leaves a file behind when run,
so the test sees whether any ran.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from datalane.engine.loader import Loader
from datalane.spec.errors import ConfigError
from datalane.spec.evals import eval_recipe
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe

EXEC_REFUSED = (
    "'builtins:exec' is not allowed: 'builtins' is a module of Python's standard library, "
    "which no filter predicate may come from (builtins:exec or os:system would run any code "
    "the data holds); write the filter in a module of your own")


def _hostile_docs(tmp_path: Path, n: int = 40) -> tuple[str, Path]:
    """A JSONL file whose documents, run as code, create ``ran``."""
    ran = tmp_path / "ran"
    path = tmp_path / "eval.jsonl"
    code = f"import pathlib; pathlib.Path({str(ran)!r}).write_text('pwned')"
    path.write_text("".join(json.dumps({"text": code}) + "\n" for _ in range(n)))
    return str(path), ran


def _recipe(corpus: Any, train_filters: dict[str, Any] | None = None,
            eval_filters: dict[str, Any] | None = None, eval_uri: str | None = None) -> Recipe:
    from tests.conftest import base_recipe_dict

    stream = {"name": "heldout", "steps": 2, "sources": [
        {"name": "val", "uris": [eval_uri or corpus.code], "chunk_bytes": 200,
         **({"filters": eval_filters} if eval_filters else {})}]}
    data = base_recipe_dict(corpus, eval=[stream])
    if train_filters:
        data["sources"][0]["filters"] = train_filters
    return load_recipe(data)


def test_an_eval_source_cannot_run_builtins_exec(corpus: Any, tmp_path: Path) -> None:
    uri, ran = _hostile_docs(tmp_path)
    r = _recipe(corpus, eval_filters={"predicate": "builtins:exec"}, eval_uri=uri)
    with pytest.raises(ConfigError) as info, \
            Loader(eval_recipe(r, "heldout"), 0, 1, Knobs(workers=1)) as loader:
        loader.next_step()
    assert str(info.value) == f"sources[0].filters.predicate {EXEC_REFUSED}"
    assert not ran.exists()  # not one document ran


@pytest.mark.parametrize("where", ["train", "eval"])
@pytest.mark.parametrize("predicate", ["builtins:exec", "os:system", "subprocess:getoutput",
                                       "importlib.util:find_spec", "pickle:loads"])
def test_standard_library_predicates_are_refused_in_every_stream(
        corpus: Any, where: str, predicate: str) -> None:
    filters = {"predicate": predicate}
    r = (_recipe(corpus, train_filters=filters) if where == "train"
         else _recipe(corpus, eval_filters=filters))
    field = "sources[0].filters.predicate" if where == "train" \
        else "eval[0].sources[0].filters.predicate"
    from datalane.spec.codepolicy import CodePolicy

    with pytest.raises(ConfigError) as info:
        CodePolicy().check_recipe(r)
    module = predicate.partition(":")[0].partition(".")[0]
    assert str(info.value).startswith(f"{field} {predicate!r} is not allowed: {module!r} is a "
                                      f"module of Python's standard library")
    built = r if where == "train" else eval_recipe(r, "heldout")
    with pytest.raises(ConfigError, match="standard library"):
        Loader(built, 0, 1, Knobs(workers=1))


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str) -> str:
    """A package ``package`` with a module ``filters`` whose ``keep`` keeps every document."""
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "filters.py").write_text("def keep(text):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{package}.filters:keep"


def test_the_allow_list_applies_to_eval_sources_too(corpus: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    package = f"dl_corp_{uuid.uuid4().hex[:8]}"
    mine = _module(tmp_path, monkeypatch, package)
    r = _recipe(corpus, eval_filters={"predicate": mine})
    heldout = eval_recipe(r, "heldout")
    with Loader(heldout, 0, 1, Knobs(workers=1), predicate_modules=[package]) as loader:
        assert loader.next_step().step == 0  # allowed: its module is listed
    with pytest.raises(ConfigError) as info:
        Loader(heldout, 0, 1, Knobs(workers=1), predicate_modules=["corp.filters"])
    assert str(info.value) == (
        f"sources[0].filters.predicate {mine!r} is not allowed: this loader admits predicates "
        f"only from the modules corp.filters (predicate_modules=). A predicate is code this "
        f"process imports and runs; add its module to predicate_modules=, or drop the "
        f"predicate")
    # a sidecar's allow-list comes from the environment, which a loader honours by default
    monkeypatch.setenv("DATALANE_PREDICATE_MODULES", "corp.filters, other")
    with pytest.raises(ConfigError) as info:
        Loader(heldout, 0, 1, Knobs(workers=1))
    assert str(info.value) == (
        f"sources[0].filters.predicate {mine!r} is not allowed: the cluster policy admits "
        f"predicates only from the modules corp.filters, other (recipes.predicateModules, "
        f"given as $DATALANE_PREDICATE_MODULES). A predicate is code the sidecar imports and "
        f"runs; ask an administrator to add its module, or drop the predicate")
    monkeypatch.setenv("DATALANE_PREDICATE_MODULES", "")  # set but empty: no module at all
    with pytest.raises(ConfigError, match="admits predicates from no module"):
        Loader(heldout, 0, 1, Knobs(workers=1))


def test_code_hooks_list_every_stream(corpus: Any) -> None:
    from datalane.spec.codepolicy import CodePolicy, code_hooks

    r = _recipe(corpus, train_filters={"predicate": "a.b:c"},
                eval_filters={"predicate": "d:e"})
    assert list(code_hooks(r, "spec.recipe.")) == [
        ("spec.recipe.sources[0].filters.predicate", "a.b:c"),
        ("spec.recipe.eval[0].sources[0].filters.predicate", "d:e")]
    with pytest.raises(ConfigError, match="must be a list of module prefixes"):
        CodePolicy.of("corp")  # type: ignore[arg-type]
