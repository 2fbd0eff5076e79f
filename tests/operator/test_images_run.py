"""The built images, run: entry points, users, read-only root filesystems, what is installed.

``make images`` builds them (``container_images`` builds what is missing). Each container runs
as a pod would run it: the image's own user, ``--read-only`` without podman's extra tmpfs
mounts, no capabilities. The images' contents are compared with this checkout: the operator
image prints the CRD that crds/ holds, the sidecar image's package is this tree's version.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .containers import IMAGE_TAG, podman

pytestmark = [pytest.mark.containers, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
HARDENED = ("--rm", "--pull=never", "--network", "none", "--read-only",
            "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt",
            "no-new-privileges")


def run(image: str, *args: str, user: str | None = None, entrypoint: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    argv = ["run", *HARDENED]
    if user is not None:
        argv += ["--user", user]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return podman(*argv, f"localhost/{image}:{IMAGE_TAG}", *args, check=False, timeout=180)


def test_operator_image_runs_its_entry_point(container_images: dict[str, str]) -> None:
    out = run("datalane-operator", "crd")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (ROOT / "crds" / "datapipelines.datalane.io.yaml").read_text()
    who = run("datalane-operator", "-c", "import os; print(os.getuid(), os.getgid())",
              entrypoint="python")
    assert who.stdout.split() == ["65532", "65532"], who.stderr


def test_sidecar_image_runs_serve_and_probe(container_images: dict[str, str]) -> None:
    out = run("datalane-sidecar", "--help")
    assert out.returncode == 0, out.stderr
    assert "{serve,probe}" in out.stdout
    # the injected startup probe, against a socket that is not there: fails, saying why
    probe = run("datalane-sidecar", "probe", "--socket", "/tmp/none.sock", "--timeout", "1")
    assert probe.returncode != 0
    assert "/tmp/none.sock" in probe.stdout + probe.stderr
    # the storage backends the chart declares, importable in the image
    mods = run("datalane-sidecar", "-c", "import s3fs, gcsfs, datalane_sidecar, os; "
               "print(os.getuid(), datalane_sidecar.__name__)", entrypoint="python")
    assert mods.returncode == 0, mods.stderr
    assert mods.stdout.split() == ["65532", "datalane_sidecar"]


def test_trainer_image_runs_the_e2e_trainer(container_images: dict[str, str]) -> None:
    out = run("datalane-trainer", "python", "-m", "tests.operator.e2e_trainer", "--help",
              user="1000:1000")
    assert out.returncode == 0, out.stderr
    assert "--checkpoint-every" in out.stdout
    ro = run("datalane-trainer", "python", "-c",
             "import datalane.client.sidecar, numpy; open('/opt/x', 'w')")
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr, ro.stderr
