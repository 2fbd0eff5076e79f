"""The playground: a local Kubernetes cluster whose node really runs the pods (``make
playground``, docs/playground.md), and the parts of it the cluster and operator tests share:
the control plane (cluster.py, certs.py) and the pod runners (podrunner.py, containers.py)."""
