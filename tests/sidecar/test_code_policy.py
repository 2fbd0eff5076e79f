"""One code policy for every stream, in the sidecar: a sidecar checks every filter
predicate of its recipe - training and eval sources - before it plans or imports anything,
against the allow-list the operator injects as ``$DATALANE_PREDICATE_MODULES`` (and never
admits Python's standard library). Real sidecar processes; a refusal is exit code 2 with the
field and the predicate, as the pod's termination message says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # real sidecar processes


def _start(recipe: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
         str(tmp_path / "dl.sock"), "--recipe", recipe],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False)


def _eval(corpus: Any, predicate: str) -> list[dict[str, Any]]:
    return [{"name": "heldout", "steps": 2, "sources": [
        {"name": "val", "uris": [corpus.code], "chunk_bytes": 8192,
         "filters": {"predicate": predicate}}]}]


@pytest.mark.parametrize("env", [{}, {"DATALANE_PREDICATE_MODULES": "builtins"}],
                         ids=["no allow-list", "builtins listed"])
def test_a_sidecar_refuses_builtins_exec_on_an_eval_source(
        write_recipe: Callable[..., str], corpus: Any, tmp_path: Path,
        env: dict[str, str]) -> None:
    proc = _start(write_recipe(eval=_eval(corpus, "builtins:exec")), tmp_path, env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith(
        "eval[0].sources[0].filters.predicate 'builtins:exec' is not allowed: 'builtins' is a "
        "module of Python's standard library, which no filter predicate may come from "
        "(builtins:exec or os:system would run any code the data holds); write the filter in "
        "a module of your own"), proc.stderr


def test_a_sidecar_applies_the_injected_allow_list_to_every_stream(
        write_recipe: Callable[..., str], corpus: Any, tmp_path: Path,
        sidecar: Callable[..., Any]) -> None:
    pkg = tmp_path / "pkgs" / "dl_team_filters"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def keep(text):\n    return True\n")
    path = {"PYTHONPATH": f"{pkg.parent}:{os.environ.get('PYTHONPATH', '')}"}
    recipe = write_recipe(eval=_eval(corpus, "dl_team_filters:keep"))
    refused = _start(recipe, tmp_path, {**path, "DATALANE_PREDICATE_MODULES": "corp.filters"})
    assert refused.returncode == 2, refused.stderr
    assert ("eval[0].sources[0].filters.predicate 'dl_team_filters:keep' is not allowed: the "
            "cluster policy admits predicates only from the modules corp.filters "
            "(recipes.predicateModules, given as $DATALANE_PREDICATE_MODULES)"
            in refused.stderr), refused.stderr
    sidecar(recipe, env={**path, "DATALANE_PREDICATE_MODULES": "corp.filters,dl_team_filters"})
