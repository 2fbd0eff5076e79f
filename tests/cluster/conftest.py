"""The control-plane fixtures and hooks (tests/cluster/plugin.py) are registered for the whole
suite by ``pytest_plugins`` in ``tests/conftest.py``, so the operator tests can use them too."""
