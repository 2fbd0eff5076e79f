"""Registers the control-plane fixtures and hooks (tests/cluster/plugin.py) for this folder."""

from .plugin import (  # noqa: F401 - pytest finds fixtures and hooks by name
    k8s_api,
    k8s_cluster,
    k8s_namespace,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    training_operator,
)
