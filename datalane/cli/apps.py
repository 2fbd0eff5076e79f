"""The console scripts of the two apps, ``datalane-sidecar`` and ``datalane-operator``.

A distribution installs every console script whatever extras were asked for, so
``pip install datalane[client]`` (what a trainer installs) gets both commands without the
modules they import. These launchers import the app's command by name only when it runs
(the library itself never imports the apps: the import-linter contract sees no import here)
and turn a module that is missing into one line naming the extra to install (exit code 2).
``--version`` answers without importing the app, so it works with any extras.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from datalane.spec.distribution import VERSION, missing_extra

__all__ = ["APPS", "operator", "sidecar"]

#: launcher name -> (the app's command module, the command, the extra it needs)
APPS: dict[str, tuple[str, str, str]] = {
    "sidecar": ("datalane_sidecar.cli", "datalane-sidecar", "sidecar"),
    "operator": ("datalane_operator.cli", "datalane-operator", "operator"),
}


def _launch(module: str, command: str, extra: str) -> int:
    if sys.argv[1:] == ["--version"]:
        print(f"{command} {VERSION}")
        return 0
    try:
        main: Callable[[], int] = importlib.import_module(module).main
        return main()
    except ModuleNotFoundError as e:
        message = missing_extra(e, command, extra)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


def sidecar() -> int:
    """``datalane-sidecar`` (``datalane_sidecar.cli``; the ``sidecar`` extra)."""
    return _launch(*APPS["sidecar"])


def operator() -> int:
    """``datalane-operator`` (``datalane_operator.cli``; the ``operator`` extra)."""
    return _launch(*APPS["operator"])
