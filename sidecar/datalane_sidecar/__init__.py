"""The datalane sidecar: serves the lanes of a pod's ranks over a Unix socket (gRPC).

Entry points: ``datalane-sidecar serve`` / ``probe`` (:mod:`datalane_sidecar.cli`). Depends on
``datalane.engine``, ``datalane.wire``, ``datalane.spec`` and ``datalane.store``.
"""

__all__: list[str] = []
