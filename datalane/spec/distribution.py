"""The datalane distribution: its version (``--version`` of every command) and which of its
extras installs a third-party module, so that a command installed without it says what to
install instead of a bare ``ModuleNotFoundError``.

``pip install datalane[client]`` installs every console script (``datalane``,
``datalane-sidecar``, ``datalane-operator``: a distribution's scripts cannot depend on an
extra); each catches the error with :func:`missing_extra`. Callers: :mod:`datalane.cli.main`,
``datalane_sidecar.cli``, ``datalane_operator.cli``.
"""

from __future__ import annotations

__all__ = ["EXTRA_OF", "VERSION", "missing_extra"]

VERSION = "0.1.0"  # pyproject.toml's [project] version (tests/cli/test_version.py keeps both)

#: top-level module -> the extra (pyproject.toml) that installs it
EXTRA_OF = {
    "pyarrow": "engine", "fsspec": "engine", "tokenizers": "engine", "zstandard": "engine",
    "jinja2": "engine",
    "grpc": "client", "google": "client",
    "s3fs": "sidecar", "prometheus_client": "sidecar",
    "kopf": "operator", "kubernetes": "operator", "cryptography": "operator",
    "torch": "torch", "torchtitan": "torchtitan",
    "lance": "lance", "huggingface_hub": "hf",
}


def missing_extra(error: ModuleNotFoundError, command: str, extra: str | None = None,
                  ) -> str | None:
    """The one line that tells the user of ``command`` which extra installs the module that
    ``error`` did not find (``extra`` overrides the module's own: the one that installs
    everything the command needs); None if the module is not one of the extras' (a bug to
    show as it is)."""
    name = (error.name or "").split(".")[0]
    if name not in EXTRA_OF:
        return None
    extra = extra or EXTRA_OF[name]
    return (f"{command}: error: the Python module {name!r} is not installed; {command} needs "
            f"the {extra!r} extra: pip install 'datalane[{extra}]'")
