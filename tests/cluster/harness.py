"""The control plane of the tests lives in playground/cluster.py (the playground starts the
same one); this name stays for the tests that import it from here."""

from playground.cluster import (
    BINARIES,
    GPU_RESOURCE,
    Cluster,
    ClusterError,
    ClusterOptions,
    GpuNode,
    KeyPair,
    cache_bin_dir,
    ensure_binaries,
    free_ports,
)

__all__ = ["BINARIES", "GPU_RESOURCE", "Cluster", "ClusterError", "ClusterOptions", "GpuNode",
           "KeyPair", "cache_bin_dir", "ensure_binaries", "free_ports"]
