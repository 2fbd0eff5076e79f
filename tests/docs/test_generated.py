"""The committed generated files are what ``make generate`` makes from the models now.

One test for all of them (docs/recipe.md's field reference, the CRD in crds/ and the Helm
chart's template of it, docs/operator.md's DataPipeline reference): a change to the recipe
model (a new format or packer declared, a field) that leaves one stale fails here naming the
file and the one command that regenerates them all.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support import paths
from tools import generate

ROOT = paths.REPO


def test_generated_files_are_up_to_date() -> None:
    stale = [str(p.relative_to(ROOT)) for p in generate.stale()]
    assert not stale, f"{', '.join(stale)} differ from the models: run `make generate`"


def test_check_names_a_stale_file_and_the_command(tmp_path: Path, monkeypatch: Any,
                                                 capsys: Any) -> None:
    for path in generate.generated():
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 0
    chart = tmp_path / "helm" / "datalane" / "templates" / "crd.yaml"
    chart.write_text(chart.read_text().replace("minimum: 1", "minimum: 2", 1))
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr().out == (
        "helm/datalane/templates/crd.yaml is stale: run `make generate`\n")
    generate.main([])
    assert generate.stale() == []
