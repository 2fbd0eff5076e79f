"""Build the images with podman on a machine without a Docker engine or a registry.

``make images`` runs this script. It builds ``images/operator``, ``images/sidecar`` and
``images/trainer`` (the tests' trainer: python, ``datalane[client]``, numpy) with
``podman build``, from a **locally made base**: Debian bookworm by ``mmdebstrap
--variant=minbase`` with python3.11 and python3-venv, imported with ``podman import`` and
passed as the Dockerfiles' ``PYTHON_IMAGE`` build argument (their default stays the pinned
public ``python:*-slim`` for real builds). The base trusts the host's CA certificates (this
machine reaches PyPI through an egress proxy with a CA of its own; pip in the build needs it)
and pip reaches PyPI through the host network (``--network host``).

Cache: each image is tagged ``localhost/<name>:<key>`` in podman's storage, where the key is
a hash of every input (the Dockerfile, its ignore file, the files of the build context that
the ignore file lets through, the build arguments, the base's key); a second run with the same
inputs finds the tag and builds nothing (about a second). The base's tarball is kept under
``${DATALANE_IMAGES_CACHE:-~/.cache/datalane/images}`` (a new podman storage imports it
again instead of running mmdebstrap), next to ``builds.json``, the log of what was built and
how long it took. ``--tag`` adds a moving tag (``localhost/<name>:<tag>``) to the current
images, e.g. ``e2e`` for the tests.

    python images/build.py                 # build what is missing
    python images/build.py --tag e2e       # ... and tag the current images :e2e
    python images/build.py --print         # only print the current tags (no build)

podman runs with ``images/containers.conf`` (``CONTAINERS_CONF``): runc with cgroupfs and
explicit rlimits, what works on these hosts; the host's configuration is not changed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "images" / "containers.conf"
CACHE = Path(os.environ.get("DATALANE_IMAGES_CACHE")
             or Path.home() / ".cache" / "datalane" / "images")
SUITE = "bookworm"
# python-is-python3: the Dockerfiles call `python`, as the python:* images have it
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
HOST_CAS = Path("/usr/local/share/ca-certificates")
BASE_NAME = "localhost/datalane-base"


@dataclass(frozen=True)
class Image:
    """One image of the repository: its Dockerfile folder, its name and build arguments."""

    folder: str
    name: str
    args: dict[str, str] = field(default_factory=dict)

    @property
    def dockerfile(self) -> Path:
        return ROOT / "images" / self.folder / "Dockerfile"

    @property
    def ignorefile(self) -> Path:
        return ROOT / "images" / self.folder / "Dockerfile.dockerignore"


IMAGES = {
    "operator": Image("operator", "datalane-operator"),
    "sidecar": Image("sidecar", "datalane-sidecar"),
    "trainer": Image("trainer", "datalane-trainer",
                     {"TORCH": os.environ.get("DATALANE_TRAINER_TORCH", "0")}),
}


class BuildError(RuntimeError):
    pass


def _log(msg: str) -> None:
    sys.stderr.write(f"[images] {time.strftime('%H:%M:%S')} {msg}\n")
    sys.stderr.flush()


def podman_env() -> dict[str, str]:
    """The environment for podman/buildah: this repository's containers.conf."""
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, capture: bool = True, check: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("podman")
    if exe is None:
        raise BuildError("podman is not installed: run images/setup.sh (as root) or "
                         "`make images`, which does")
    proc = subprocess.run([exe, *args], env=podman_env(), text=True, check=False,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.PIPE if capture else None)
    if check and proc.returncode != 0:
        raise BuildError(f"podman {' '.join(args)} exited with {proc.returncode}:\n"
                         f"{(proc.stderr or '')[-4000:]}")
    return proc


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


# -- keys ----------------------------------------------------------------------------------
def _digest(parts: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in parts:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def _host_cas() -> list[Path]:
    return sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []


def _mmdebstrap_argv(tarball: Path) -> list[str]:
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*"]
    if _host_cas():
        argv += [f"--customize-hook=copy-in {' '.join(map(str, _host_cas()))} "
                 f"/usr/local/share/ca-certificates/",
                 '--customize-hook=chroot "$1" update-ca-certificates']
    return [*argv, SUITE, str(tarball)]


# What `podman import` sets on the base: what the python:* images set, and pip's CA bundle
# (pip's own certifi does not have the host's CAs).
BASE_CHANGES = ("ENV LANG=C.UTF-8",
                "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
                'CMD ["python3"]')


def base_key() -> str:
    parts = [("argv", json.dumps(_mmdebstrap_argv(Path("base.tar"))).encode()),
             ("changes", json.dumps(BASE_CHANGES).encode())]
    parts += [(f"ca/{p.name}", p.read_bytes()) for p in _host_cas()]
    return _digest(parts)


def _ignore_patterns(image: Image) -> list[str]:
    return [ln.strip() for ln in image.ignorefile.read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def _ignored(rel: str, patterns: Sequence[str]) -> bool:
    """The .dockerignore rule: the last matching pattern wins (``!`` re-includes)."""
    out = False
    for pat in patterns:
        negate = pat.startswith("!")
        p = pat[1:] if negate else pat
        p = p.removeprefix("./")
        hit = fnmatch.fnmatchcase(rel, p) or (p.endswith("/**") and (
            rel == p[:-3] or rel.startswith(p[:-2])))
        if p.startswith("**/"):
            tail = p[3:]
            hit = hit or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], tail) or any(
                fnmatch.fnmatchcase(part, tail) for part in rel.split("/")[:-1])
        if hit:
            out = not negate
    return out


def context_files(image: Image) -> list[str]:
    """The files of the build context that the image's ignore file lets through (relative to
    the repository root), i.e. what the build can see: the cache key hashes them all."""
    patterns = _ignore_patterns(image)
    tops = set()
    for pat in patterns:
        if pat.startswith("!"):  # the folder or file before the first wildcard
            plain = [part for part in pat[1:].split("/")]
            cut = next((i for i, part in enumerate(plain) if set(part) & set("*?[")),
                       len(plain))
            tops.add("/".join(plain[:cut]))
    out: list[str] = []
    for top in sorted(tops):
        base = ROOT / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in paths:
            rel = path.relative_to(ROOT).as_posix()
            if not _ignored(rel, patterns):
                out.append(rel)
    return out


def image_key(image: Image, base: str) -> str:
    parts = [("dockerfile", image.dockerfile.read_bytes()),
             ("ignore", image.ignorefile.read_bytes()),
             ("args", json.dumps(sorted(image.args.items())).encode()),
             ("base", base.encode())]
    parts += [(f"ctx/{rel}", (ROOT / rel).read_bytes()) for rel in context_files(image)]
    return _digest(parts)


def base_ref() -> str:
    return f"{BASE_NAME}:{base_key()}"


def image_ref(image: Image) -> str:
    return f"localhost/{image.name}:{image_key(image, base_ref())}"


# -- building ------------------------------------------------------------------------------
def _record(what: str, ref: str, seconds: float) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "builds.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    rows.append({"what": what, "ref": ref, "seconds": round(seconds, 1),
                 "at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    path.write_text(json.dumps(rows[-200:], indent=1) + "\n")


def build_base() -> str:
    ref = base_ref()
    if image_exists(ref):
        return ref
    t0 = time.monotonic()
    key = ref.rsplit(":", 1)[1]
    tarball = CACHE / f"base-{SUITE}-{key}.tar"
    if not tarball.exists():
        if shutil.which("mmdebstrap") is None:
            raise BuildError("mmdebstrap is not installed: run images/setup.sh (as root)")
        CACHE.mkdir(parents=True, exist_ok=True)
        _log(f"base {ref}: mmdebstrap {SUITE} (about 2 minutes)")
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            part = Path(tmp) / "base.tar"
            proc = subprocess.run(_mmdebstrap_argv(part), text=True, capture_output=True,
                                  check=False)
            if proc.returncode != 0:
                raise BuildError(f"mmdebstrap exited with {proc.returncode}:\n"
                                 f"{proc.stderr[-4000:]}")
            part.rename(tarball)
    _log(f"base {ref}: podman import {tarball}")
    changes = [a for c in BASE_CHANGES for a in ("--change", c)]
    podman("import", *changes, str(tarball), ref)
    _record("base", ref, time.monotonic() - t0)
    return ref


def build_image(image: Image, base: str) -> str:
    ref = f"localhost/{image.name}:{image_key(image, base)}"
    if image_exists(ref):
        _log(f"{image.folder}: cached ({ref})")
        return ref
    _log(f"{image.folder}: building {ref}")
    t0 = time.monotonic()
    args = [a for k, v in {"PYTHON_IMAGE": base, **image.args}.items()
            for a in ("--build-arg", f"{k}={v}")]
    log = CACHE / f"build-{image.folder}.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run(
            [shutil.which("podman") or "podman", "build", "--network", "host",
             "--pull=never", "--layers", "--file", str(image.dockerfile),
             "--ignorefile", str(image.ignorefile), *args, "--tag", ref, str(ROOT)],
            env=podman_env(), stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"podman build of images/{image.folder} exited with "
                         f"{proc.returncode} (log: {log}):\n{tail}")
    seconds = time.monotonic() - t0
    _record(image.folder, ref, seconds)
    _log(f"{image.folder}: built in {seconds:.0f} s")
    prune(image)
    return ref


KEEP = 3  # keys of each image kept in podman's storage (older ones are removed after a build)


def prune(image: Image, keep: int = KEEP) -> None:
    """Remove all but the ``keep`` newest keyed tags of ``image`` and the dangling layers of
    earlier builds, so that a machine building every commit does not fill its disk."""
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.CreatedAt}}",
                 "--filter", f"reference=localhost/{image.name}").stdout
    rows = sorted((line.split(" ", 1) for line in out.splitlines() if " " in line),
                  key=lambda r: r[1], reverse=True)
    keyed = [ref for ref, _ in rows if len(ref.rsplit(":", 1)[1]) == 16]
    for ref in keyed[keep:]:
        podman("rmi", ref, check=False)
    podman("image", "prune", "--force", check=False)


@contextlib.contextmanager
def _one_build_at_a_time() -> Iterator[None]:
    """A lock in the cache folder: a test run and `make images` (or two test runs) that
    start together build each image once; the second finds it cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log("another build is running; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure(names: Sequence[str] = tuple(IMAGES), tag: str | None = None) -> dict[str, str]:
    """Build what is missing; ``{folder: localhost/name:key}`` of the current images (each
    also tagged ``localhost/name:<tag>`` when ``tag`` is given)."""
    with _one_build_at_a_time():
        base = build_base()
        out = {}
        for name in names:
            ref = build_image(IMAGES[name], base)
            if tag is not None:
                podman("tag", ref, f"localhost/{IMAGES[name].name}:{tag}")
            out[name] = ref
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("images", nargs="*", help=f"which of {', '.join(IMAGES)} (default: all)")
    p.add_argument("--tag", help="also tag the current images localhost/<name>:TAG")
    p.add_argument("--print", action="store_true", help="print the current tags, build nothing")
    args = p.parse_args(argv)
    names = args.images or list(IMAGES)
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        p.error(f"unknown image {', '.join(unknown)}: choose from {', '.join(IMAGES)}")
    if args.print:
        for name in names:
            sys.stdout.write(image_ref(IMAGES[name]) + "\n")
        return 0
    t0 = time.monotonic()
    try:
        refs = ensure(names, args.tag)
    except BuildError as e:
        sys.stderr.write(f"[images] FAILED: {e}\n")
        return 1
    for ref in refs.values():
        sys.stdout.write(ref + "\n")
    _log(f"done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
