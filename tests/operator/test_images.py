"""The Dockerfiles, checked statically: bases pinned by digest, dependencies installed at the
exact versions of images/constraints.txt, multi-stage, non-root, read-only-rootfs friendly,
entry points that exist in the package; the trainer image; the cache key and the dependency
list of images/build.py and images/requirements.py. The images are run in
test_images_run.py and test_e2e.py."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"operator": ("datalane-operator", "operator", "run"),
          "sidecar": ("datalane-sidecar", "sidecar", "serve")}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile(image: str) -> None:
    script, extra, subcommand = IMAGES[image]
    path = ROOT / "images" / image / "Dockerfile"
    ins = instructions(path)
    args = {k: v for k, v in (a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)}
    froms = [a for w, a in ins if w == "FROM"]
    assert len(froms) >= 2, "multi-stage: a builder and a runtime stage"
    for f in froms:
        ref = f.split()[0]
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        assert "latest" not in ref
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}", ref), (
            f"{path}: base {ref} is not pinned to a full version and its digest")
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]
    users = [a for w, a in final if w == "USER"]
    assert users, f"{path}: the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root user (runAsNonRoot can check it)"
    env = " ".join(a for w, a in final if w == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "no .pyc writes on a read-only root filesystem"
    assert "HOME=/tmp" in env
    assert any(w == "COPY" and a.startswith("--from=builder") for w, a in final)
    assert not any(w == "ADD" for w, _ in ins), "COPY, not ADD"
    installs = " ".join(a for w, a in ins if w == "RUN")
    assert f'--constraint constraints.txt ".[{extra}]"' in installs, (
        f"{path}: the extra is not installed with the lock")
    assert ("COPY", "images/constraints.txt ./constraints.txt") in ins
    assert extra in pyproject()["project"]["optional-dependencies"]  # type: ignore[index]
    # pip itself is pinned too
    assert re.search(r"pip==\d+\.\d+", installs)
    entry = [a for w, a in final if w == "ENTRYPOINT"]
    assert entry == [f'["{script}"]']
    cmd = [a for w, a in final if w == "CMD"]
    assert cmd == [f'["{subcommand}"]']
    # the entry point exists in the package and accepts the default subcommand
    target = pyproject()["project"]["scripts"][script]  # type: ignore[index]
    module, func = target.split(":")
    main = getattr(importlib.import_module(module), func)
    assert callable(main)
    # the console script is a launcher (datalane.cli.apps): the parser is the app's own
    assert module == "datalane.cli.apps", target
    app_module, command, app_extra = importlib.import_module(module).APPS[func]
    assert (command, app_extra) == (script, extra)
    parser = importlib.import_module(app_module)._parser()
    assert subcommand in parser._subparsers._group_actions[0].choices


@pytest.mark.parametrize("image", [*sorted(IMAGES), "trainer"])
def test_build_context_is_trimmed(image: str) -> None:
    ignore = (ROOT / "images" / image / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*")] == "*"  # everything is excluded first
    copied = [a.split()[0] for w, a in instructions(ROOT / "images" / image / "Dockerfile")
              if w == "COPY" and not a.startswith("--from")]
    for src in copied:
        assert f"!{src.rstrip('/')}" in ignore or f"!{src.rstrip('/')}/**" in ignore, src


def test_sidecar_image_runs_what_the_operator_injects() -> None:
    """The injected container runs `datalane-sidecar serve` and probes with
    `datalane-sidecar probe`: both must be on the image's PATH (the venv's bin)."""
    from datalane_operator.inject import sidecar_container
    from datalane_operator.pipeline import load_pipeline

    from .builders import dp

    side = sidecar_container(load_pipeline(dp()), "img:1", 1)
    assert side["command"][0] == "datalane-sidecar"
    assert side["startupProbe"]["exec"]["command"][0] == "datalane-sidecar"
    env = " ".join(a for w, a in instructions(ROOT / "images/sidecar/Dockerfile") if w == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env
    assert "datalane-sidecar" in pyproject()["project"]["scripts"]  # type: ignore[operator]


def _constraints() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "images" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"images/constraints.txt: {line!r} is not name==version"
            out[name] = version
    return out


def test_the_lock_pins_every_dependency_of_the_images_within_pyproject_ranges() -> None:
    """Every package that datalane[sidecar] and datalane[operator] pull in is pinned exactly,
    at a version inside pyproject.toml's ranges (a new dependency without a pin fails here:
    run `python images/constraints.py`)."""
    import importlib.util

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    spec = importlib.util.spec_from_file_location("lock", ROOT / "images" / "constraints.py")
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    pinned = _constraints()
    needed = lock.closure()
    assert sorted(set(needed) - set(pinned)) == [], "not pinned in images/constraints.txt"
    assert {"grpcio", "kopf", "kubernetes", "s3fs", "pyarrow", "tokenizers"} <= set(pinned)
    deps = pyproject()["project"]
    ranges = [*deps["dependencies"], *(r for extra in ("engine", "client", "sidecar", "operator")  # type: ignore[index]
                                       for r in deps["optional-dependencies"][extra])]  # type: ignore[index]
    for text in ranges:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "datalane":
            continue
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"images/constraints.txt pins {name}=={pinned[name]}, outside {text!r}")


# -- the trainer image and the local build (images/build.py) -------------------------------
def _module(name: str) -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"images_{name}",
                                                  ROOT / "images" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_trainer_dockerfile() -> None:
    path = ROOT / "images" / "trainer" / "Dockerfile"
    ins = instructions(path)
    args = {k: v for k, v in (a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)}
    assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*@sha256:[0-9a-f]{64}",
                        args["PYTHON_IMAGE"]), "the default base is pinned by digest"
    assert args["TORCH"] == "0", "torch is optional, off by default"
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM"):]
    uid = [a for w, a in final if w == "USER"][-1].split(":")[0]
    sidecar_uid = [a for w, a in instructions(ROOT / "images/sidecar/Dockerfile")
                   if w == "USER"][-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0 and uid != sidecar_uid, (
        "a non-root user other than the sidecar's: the socket is shared through a group")
    installs = " ".join(a for w, a in ins if w == "RUN")
    assert '--constraint constraints.txt ".[client]"' in installs
    env = " ".join(a for w, a in final if w == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    # the e2e's command resolves from the working directory
    assert ("WORKDIR", "/opt/trainer") in final
    assert ("COPY", "tests/operator/e2e_trainer.py ./tests/operator/e2e_trainer.py") in final


@pytest.mark.parametrize("image", ["operator", "sidecar", "trainer"])
def test_every_copied_path_is_in_the_build_context(image: str) -> None:
    """What a COPY names is what the ignore file lets through: the cache key of
    images/build.py hashes exactly those files."""
    build = _module("build")
    files = build.context_files(build.IMAGES[image])
    for w, a in instructions(ROOT / "images" / image / "Dockerfile"):
        if w == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert any(f == src or f.startswith(src.rstrip("/") + "/") for f in files), src
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    if image == "trainer":
        assert "tests/operator/e2e_trainer.py" in files
        assert "tests/operator/test_e2e.py" not in files  # only what the image needs


def test_image_key_follows_the_build_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              ) -> None:
    build = _module("build")
    (tmp_path / "images" / "x").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "images/x/Dockerfile").write_text("FROM base\nCOPY pkg ./pkg\n")
    (tmp_path / "images/x/Dockerfile.dockerignore").write_text(
        "*\n!pkg/**\n**/__pycache__\n**/*.pyc\n")
    (tmp_path / "pkg/a.py").write_text("A = 1\n")
    (tmp_path / "other/b.py").write_text("B = 1\n")
    monkeypatch.setattr(build, "ROOT", tmp_path)
    image = build.Image("x", "x")
    assert build.context_files(image) == ["pkg/a.py"]
    key = build.image_key(image, "base:1")
    assert len(key) == 16
    # outside the context: the same key
    (tmp_path / "other/b.py").write_text("B = 2\n")
    (tmp_path / "pkg/__pycache__/a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg/c.pyc").write_bytes(b"\0")
    assert build.image_key(image, "base:1") == key
    # a file of the context, the Dockerfile, a build argument, the base: a new key
    (tmp_path / "pkg/a.py").write_text("A = 2\n")
    changed = build.image_key(image, "base:1")
    assert changed != key
    (tmp_path / "pkg/new.py").write_text("")
    assert build.image_key(image, "base:1") != changed
    assert build.image_key(image, "base:2") != build.image_key(image, "base:1")
    assert build.image_key(build.Image("x", "x", {"TORCH": "1"}), "base:1") != (
        build.image_key(image, "base:1"))
    (tmp_path / "images/x/Dockerfile").write_text("FROM base\nCOPY pkg ./pkg\nUSER 1\n")
    assert build.image_key(image, "base:1") != build.image_key(
        build.Image("x", "x"), "base:0")


def test_requirements_of_an_extra_expand_the_self_references(tmp_path: Path) -> None:
    req = _module("requirements")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "datalane"\ndependencies = ["numpy>=1.26"]\n'
        '[project.optional-dependencies]\n'
        'engine = ["pyarrow>=15", "fsspec>=2024.2"]\n'
        'client = ["grpcio>=1.85.1"]\n'
        'sidecar = ["datalane[engine, client]", "s3fs>=2024.2"]\n'
        'loop = ["datalane[sidecar,loop]"]\n')
    assert req.requirements(tmp_path / "pyproject.toml", ["client"]) == [
        "grpcio>=1.85.1", "numpy>=1.26"]
    assert req.requirements(tmp_path / "pyproject.toml", ["loop"]) == [
        "fsspec>=2024.2", "grpcio>=1.85.1", "numpy>=1.26", "pyarrow>=15", "s3fs>=2024.2"]
    with pytest.raises(SystemExit, match="no extra 'gpu'"):
        req.requirements(tmp_path / "pyproject.toml", ["gpu"])
