"""The container runner lives in playground/containers.py (the playground's node agent runs
pods with it); this module keeps its names for the tests and the ``container_images``
fixture: the images of the working tree, tagged ``:e2e``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from playground.containers import (
    IMAGE_TAG,
    ContainerRunner,
    cpu_cores,
    images_build,
    podman,
    quantity_bytes,
    trainer_image,
)

__all__ = ["IMAGE_TAG", "ContainerRunner", "container_images", "cpu_cores", "podman",
           "quantity_bytes", "trainer_image"]


@pytest.fixture(scope="session")
def container_images(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The images of the working tree, built if missing (``make images`` builds them first;
    cached: a second), tagged ``:e2e``. Never skipped: without podman this fails, naming
    images/setup.sh, which ``make images`` runs."""
    build = images_build()
    capman = request.config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        try:
            refs: dict[str, str] = build.ensure(tag=IMAGE_TAG)
        except build.BuildError as e:
            pytest.fail(f"the container images cannot be built: {e}", pytrace=False)
    yield refs
