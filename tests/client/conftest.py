"""The client tier uses the sidecar tier's real sidecar processes (``sidecar`` fixture)."""

from tests.sidecar.conftest import repeat_recipe, sidecar  # noqa: F401  (the fixtures)
