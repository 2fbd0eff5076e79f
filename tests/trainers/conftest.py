"""Trainer-tier fixtures: real sidecar processes (shared with the sidecar tier) and torchrun-
style multi-process jobs on loopback."""

from tests.sidecar.conftest import repeat_recipe, sidecar

__all__ = ["repeat_recipe", "sidecar"]
