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
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--recipe", "r.yaml", "--image-bytes", "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith("datalane-sidecar serve: error: argument "
                                            "--image-bytes: 0 is not in 1..1099511627776\n")


@pytest.mark.parametrize(("env", "value", "message"), [
    ("DATALANE_IMAGE_BYTES", "abc", "argument --image-bytes: DATALANE_IMAGE_BYTES: 'abc' is not "
                                    "an integer"),
    # Knobs' bound (1 << 40), refused here by the variable's name, not later as knobs.image_bytes
    ("DATALANE_IMAGE_BYTES", str((1 << 40) + 1), "argument --image-bytes: DATALANE_IMAGE_BYTES: "
                                                 "1099511627777 is not in 1..1099511627776"),
    ("DATALANE_WORKERS", "257", "argument --workers: DATALANE_WORKERS: 257 is not in 1..256"),
    ("DATALANE_MAP_PROCESSES", "-1", "argument --map-processes: DATALANE_MAP_PROCESSES: -1 is "
                                     "not in 0..256"),
    ("DATALANE_MAP_PROCESSES", "two", "argument --map-processes: DATALANE_MAP_PROCESSES: 'two' "
                                      "is not an integer"),
    ("DATALANE_WORKERS", "2.5", "argument --workers: DATALANE_WORKERS: '2.5' is not an integer"),
    ("DATALANE_PREFETCH", "0", "argument --prefetch: DATALANE_PREFETCH: 0 is not in 1..1024"),
    ("DATALANE_RANKS_PER_POD", "-1", "argument --ranks-per-pod: DATALANE_RANKS_PER_POD: -1 is "
                                     "not in 1..65536"),
    ("DATALANE_MAX_STREAMS", "x", "argument --max-streams: DATALANE_MAX_STREAMS: 'x' is not an "
                                  "integer"),
    ("DATALANE_METRICS_PORT", "65536", "argument --metrics-port: DATALANE_METRICS_PORT: 65536 "
                                       "is not in 0..65535"),
])
def test_a_bad_integer_variable_is_refused_naming_it(monkeypatch, capsys, env: str, value: str,
                                                      message: str) -> None:
    """A malformed variable fails serve with its name and value (argparse's usage error, exit
    2), not a ValueError traceback while the parser is built; probe, which has no such flag,
    still parses."""
    from datalane_sidecar import cli

    monkeypatch.setenv(env, value)
    with pytest.raises(SystemExit) as exited:
        cli._parser().parse_args(["serve"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.endswith(f"datalane-sidecar serve: error: {message}\n"), err
    assert cli._parser().parse_args(["probe"]).command == "probe"
    # a flag given wins over the variable, which is then not read
    flag = "--" + env.removeprefix("DATALANE_").lower().replace("_", "-")
    ok = "1" if env != "DATALANE_METRICS_PORT" else "9100"
    assert getattr(cli._parser().parse_args(["serve", flag, ok]),
                   flag[2:].replace("-", "_")) == int(ok)


def test_an_empty_integer_variable_means_the_default(monkeypatch) -> None:
    from datalane_sidecar import cli

    monkeypatch.setenv("DATALANE_WORKERS", "")
    monkeypatch.setenv("DATALANE_IMAGE_BYTES", "")
    monkeypatch.setenv("DATALANE_MAP_PROCESSES", "")
    args = cli._parser().parse_args(["serve"])
    assert (args.workers, args.image_bytes, args.prefetch) == (2, 512 << 20, 8)
    assert args.map_processes == 0
