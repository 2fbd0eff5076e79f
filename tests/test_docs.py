"""Docs stay true: their Python examples run, their recipes load, the reference is generated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from datalane.spec import model
from datalane.spec.recipe import Recipe

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(rf"^```{lang}\n(.*?)^```$", text, re.M | re.S):
            out.append((path.name, text[:m.start()].count("\n") + 1, m.group(1)))
    return out


@pytest.mark.parametrize("name,line,code", _blocks("python"),
                         ids=lambda v: str(v) if isinstance(v, (int,)) else None)
def test_python_examples_run(name, line, code, tmp_path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"{name}:{line} failed:\n{proc.stderr}"


def test_recipe_examples_are_valid_recipes() -> None:
    # recipe documents (Kubernetes objects such as a DataPipeline carry `kind:` instead)
    recipes = [c for _, _, c in _blocks("yaml") if "sources:" in c and "kind:" not in c]
    assert recipes
    for code in recipes:
        model.load(Recipe, yaml.safe_load(code), "")  # raises with the field on any error


def test_recipe_reference_is_generated_from_the_model() -> None:
    from tools.recipe_reference import render_fields

    text = (ROOT / "docs" / "recipe.md").read_text()
    generated = text.split("<!-- fields:begin -->\n", 1)[1].split("\n<!-- fields:end -->")[0]
    assert generated == render_fields(), "run `make generate` and commit"


def test_documented_lane_state_parses() -> None:
    import json

    from datalane.spec.state import LaneState

    examples = [c for _, _, c in _blocks("json") if '"v": 2' in c]
    assert examples
    for code in examples:
        LaneState.from_json(json.loads(code))
