"""Regenerate every committed file that is generated from the models, in one command.

``make generate`` (``python tools/generate.py``) rewrites, from the recipe model
(:mod:`datalane.spec.recipe`, whose format and packer choices come from
:mod:`datalane.spec.formats` and :mod:`datalane.spec.packing`) and the operator's pipeline
model:

* the field reference of ``docs/recipe.md`` (:mod:`tools.recipe_reference`);
* the CRD ``crds/datapipelines.datalane.io.yaml`` (:func:`datalane_operator.crd.crd_yaml`)
  and the Helm chart's copy of it in ``helm/datalane/crds/``;
* the DataPipeline field reference of ``docs/operator.md``
  (:mod:`datalane_operator.reference`).

``--check`` writes nothing and exits 1 naming the files that differ;
tests/docs/test_generated.py runs it and tells which command to run. Runs from a fresh clone's
root with the package installed (``make setup``) or on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]  # a fresh clone without `pip install -e .`

from datalane_operator.crd import CRD_FILE, crd_yaml  # noqa: E402
from datalane_operator.reference import BEGIN as CRD_BEGIN  # noqa: E402
from datalane_operator.reference import END as CRD_END  # noqa: E402
from datalane_operator.reference import render_reference  # noqa: E402

from tools.recipe_reference import BEGIN, END, render_fields  # noqa: E402

__all__ = ["generated", "main", "stale"]

COMMAND = "make generate"


def _between(text: str, begin: str, end: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def generated() -> dict[Path, Callable[[str], str]]:
    """Each generated file -> its new content from its current one."""
    crd = crd_yaml()
    return {
        ROOT / "docs" / "recipe.md": lambda text: _between(text, BEGIN, END,
                                                          render_fields() + "\n"),
        ROOT / CRD_FILE: lambda _: crd,
        ROOT / "helm" / "datalane" / CRD_FILE: lambda _: crd,
        ROOT / "docs" / "operator.md": lambda text: _between(text, CRD_BEGIN, CRD_END,
                                                             render_reference()),
    }


def stale() -> list[Path]:
    """The generated files whose committed content is not what the models generate."""
    return [path for path, make in generated().items()
            if not path.exists() or make(path.read_text()) != path.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the files that differ")
    args = parser.parse_args(argv)
    if args.check:
        out = stale()
        for path in out:
            print(f"{path.relative_to(ROOT)} is stale: run `{COMMAND}`")  # noqa: T201
        return 1 if out else 0
    for path, make in generated().items():
        old = path.read_text() if path.exists() else ""
        new = make(old)
        if new != old:
            path.write_text(new)
        print(f"{path.relative_to(ROOT)}: {'rewritten' if new != old else 'up to date'}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
