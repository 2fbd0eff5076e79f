"""Fixtures of the operator tests: the real control plane of tests/cluster/plugin.py
(``k8s_cluster``, ``k8s_api``, ``k8s_namespace``, ``training_operator``), registered for the
whole suite in tests/conftest.py, so one control plane serves every tier of a run; and
``container_images`` (tests/operator/containers.py), the images the container e2e runs."""

from .containers import container_images

__all__ = ["container_images"]
