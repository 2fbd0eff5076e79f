"""Print the requirements of ``datalane[EXTRA,...]`` as pyproject.toml names them.

The images' builder stages install the dependencies *before* they copy the source tree:
``python requirements.py sidecar > requirements.txt`` then ``pip install --constraint
constraints.txt --requirement requirements.txt`` is a layer that only pyproject.toml and the
lock invalidate, so a source edit rebuilds an image in seconds instead of minutes. Standard
library only (it runs in the bare base image). The ``datalane[...]`` references between extras
are expanded here; pip resolves the rest, at the lock's versions.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_SELF = re.compile(r"^datalane\[([^\]]+)\]$")


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out = set(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r}: {', '.join(optional)}")
        seen.add(extra)
        for req in optional[extra]:
            m = _SELF.match(req.replace(" ", ""))
            if m:
                todo += m.group(1).split(",")
            else:
                out.add(req)
    return sorted(out)


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: requirements.py EXTRA [EXTRA ...]\n")
        return 2
    sys.stdout.write("".join(r + "\n" for r in requirements(Path("pyproject.toml"), argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
