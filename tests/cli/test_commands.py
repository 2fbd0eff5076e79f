"""Every command's ``--help`` and ``--version``, and the commands of an install that lacks an
extra (as ``pip install datalane[client]`` leaves them): subprocesses, as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# What `pip install datalane[client]` does not install (every other extra's modules): a finder
# that refuses them, as a fresh virtualenv with only the client extra does.
_CLIENT_ONLY = """
import runpy, sys
MISSING = {"pyarrow", "fsspec", "tokenizers", "zstandard", "jinja2", "s3fs",
           "prometheus_client", "kopf", "kubernetes", "cryptography", "torch", "torchtitan",
           "lance", "huggingface_hub"}
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
from datalane.cli import apps, main
script = {"datalane": main, "datalane-sidecar": apps.sidecar,
          "datalane-operator": apps.operator}[sys.argv[1]]
sys.argv = sys.argv[1:]
sys.exit(script())
"""


def _run(*cmd: str, client_only: bool = False) -> subprocess.CompletedProcess[str]:
    if client_only:
        cmd = (sys.executable, "-c", _CLIENT_ONLY, *cmd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})


def test_help_lists_the_commands_and_nothing_hidden() -> None:
    proc = _run(sys.executable, "-m", "datalane.cli", "--help")
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^    (\w+) +\S", proc.stdout, re.M)
    assert listed == ["run", "verify", "demo", "audit", "inspect"]
    assert "SUPPRESS" not in proc.stdout and "_rank" not in proc.stdout
    assert "_trainer" not in proc.stdout


@pytest.mark.parametrize("module,prog", [("datalane.cli", "datalane"),
                                         ("datalane_sidecar", "datalane-sidecar"),
                                         ("datalane_operator", "datalane-operator")])
def test_every_command_has_a_version(module: str, prog: str) -> None:
    proc = _run(sys.executable, "-m", module, "--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{prog} {VERSION}\n", "")


def test_the_version_is_the_distributions() -> None:
    import datalane
    from datalane.spec.distribution import VERSION as declared

    assert datalane.__version__ == declared == VERSION


@pytest.mark.parametrize("script", ["datalane", "datalane-sidecar", "datalane-operator"])
def test_version_needs_no_extra(script: str) -> None:
    proc = _run(script, "--version", client_only=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{script} {VERSION}\n", "")


def test_commands_without_their_extra_name_it(write_recipe, tmp_path) -> None:
    """Each command of a client-only install ends with one line naming the extra to install
    (exit code 2), never a ModuleNotFoundError traceback."""
    recipe = write_recipe()
    cases = [
        (("datalane", "run", recipe, "--steps", "1"), "datalane run", "engine", "tokenizers"),
        (("datalane", "demo", "--dir", str(tmp_path / "d")), "datalane demo", "demo",
         "pyarrow"),
        (("datalane-sidecar", "serve", "--recipe", recipe, "--socket",
          str(tmp_path / "s.sock")), "datalane-sidecar", "sidecar", None),
        (("datalane-operator", "crd"), "datalane-operator", "operator", "fsspec"),
    ]
    for cmd, prog, extra, module in cases:
        proc = _run(*cmd, client_only=True)
        assert proc.returncode == 2, (cmd, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line, line
        assert line.startswith(f"{prog}: error: the Python module "), line
        assert line.endswith(f"needs the {extra!r} extra: pip install 'datalane[{extra}]'"), line
        if module is not None:
            assert f"module {module!r} is not installed" in line, line


def test_the_sidecar_sets_the_knob_from_its_flag_or_env(monkeypatch, capsys) -> None:
    from datalane_sidecar import cli

    from datalane.spec.knobs import Knobs

    assert cli._parser().parse_args(["serve"]).image_bytes == Knobs().image_bytes == 512 << 20
    assert cli._parser().parse_args(["serve", "--image-bytes", "7"]).image_bytes == 7
    monkeypatch.setenv("DATALANE_IMAGE_BYTES", "9")
    assert cli._parser().parse_args(["serve"]).image_bytes == 9
    assert cli.main(["serve", "--recipe", "r.yaml", "--image-bytes", "0"]) == 2
    assert capsys.readouterr().err == ("datalane-sidecar serve: error: --image-bytes must be 1 "
                                       "or more, not 0\n")
