"""What a PyTorchJob means for the lanes: pods, ranks per pod and the data-parallel world size.

Kubeflow's training-operator runs ``replicas`` pods per replica type (``Master``, ``Worker``)
and torchrun starts ``nprocPerNode`` ranks in each, so the world size is
``(sum of replicas) x nprocPerNode``. ``nprocPerNode`` is ``auto``, ``gpu``, ``cpu`` or an
integer (training-operator v1; the deprecated ``elasticPolicy.nProcPerNode`` is honoured);
``gpu`` and ``auto`` resolve to the trainer container's ``nvidia.com/gpu`` limit, ``cpu`` to
an integer CPU limit, as torchrun would count them.

The scale guard lives here: :func:`check_workers` refuses a worker count whose world size
does not divide the lanes, naming the counts that would work. Pure functions over plain
dicts (the objects as the API server sends them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError
from datalane.spec.lanes import valid_world_sizes

__all__ = [
    "GPU_RESOURCE",
    "Topology",
    "check_workers",
    "nproc_of_container",
    "topology_of",
    "trainer_container",
    "valid_worker_counts",
]

GPU_RESOURCE = "nvidia.com/gpu"
WORKER = "Worker"


def _or_list(values: list[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@dataclass(frozen=True)
class Topology:
    """Pods and ranks of a job. ``nproc`` is None when it cannot be known from the spec."""

    replicas: Mapping[str, int]
    nproc: int | None
    nproc_source: str = ""

    @property
    def pods(self) -> int:
        return sum(self.replicas.values())

    @property
    def workers(self) -> int:
        return self.replicas.get(WORKER, 0)

    @property
    def others(self) -> int:
        """Pods of every replica type but Worker (the Master, usually 0 or 1)."""
        return self.pods - self.workers

    @property
    def world_size(self) -> int | None:
        return None if self.nproc is None else self.pods * self.nproc

    def with_workers(self, workers: int) -> Topology:
        replicas = dict(self.replicas)
        replicas[WORKER] = workers
        return Topology(replicas, self.nproc, self.nproc_source)


def trainer_container(pod_spec: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The container called ``name`` in a pod spec, or None."""
    for c in pod_spec.get("containers") or []:
        if c.get("name") == name:
            return c  # type: ignore[no-any-return]
    return None


def _int_quantity(value: Any) -> int | None:
    """An integer resource quantity ("2", 2) or None ("500m", "1.5", absent)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def nproc_of_container(setting: Any, container: Mapping[str, Any] | None) -> tuple[int | None,
                                                                                   str]:
    """Resolve ``nprocPerNode`` for a pod whose trainer is ``container``: (count, reason).

    The count is None when the spec does not determine it (``cpu`` without an integer CPU
    limit, a value torchrun would reject); the reason says why, for conditions and warnings.
    """
    raw = "auto" if setting is None or setting == "" else setting
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (raw, f"nprocPerNode {raw}") if raw >= 1 else (None, f"nprocPerNode {raw} < 1")
    text = str(raw).strip()
    if text.isdigit():
        n = int(text)
        return (n, f"nprocPerNode {n}") if n >= 1 else (None, f"nprocPerNode {text} < 1")
    limits = ((container or {}).get("resources") or {}).get("limits") or {}
    gpus = _int_quantity(limits.get(GPU_RESOURCE))
    cpus = _int_quantity(limits.get("cpu"))
    if text in ("auto", "gpu"):
        if gpus:
            return gpus, f"nprocPerNode {text!r}: {gpus} x {GPU_RESOURCE}"
        if text == "gpu":
            return None, f"nprocPerNode 'gpu' but the trainer container has no {GPU_RESOURCE} limit"
    if text in ("auto", "cpu"):
        if cpus:
            return cpus, f"nprocPerNode {text!r}: {cpus} CPUs"
        return None, (f"nprocPerNode {text!r} depends on the node's CPU count; set an integer "
                      f"nprocPerNode or an integer cpu limit")
    return None, f"nprocPerNode {text!r} is not auto, gpu, cpu or an integer"


def topology_of(job: Mapping[str, Any], container: str = "pytorch") -> Topology:
    """Pods per replica type and ranks per pod of a PyTorchJob object."""
    spec = job.get("spec") or {}
    replicas: dict[str, int] = {}
    trainer: Mapping[str, Any] | None = None
    for rtype, rspec in (spec.get("pytorchReplicaSpecs") or {}).items():
        count = (rspec or {}).get("replicas")
        replicas[rtype] = 1 if count is None else int(count)
        tmpl = ((rspec or {}).get("template") or {}).get("spec") or {}
        if trainer is None or rtype == WORKER:
            trainer = trainer_container(tmpl, container) or trainer
    setting = spec.get("nprocPerNode")
    if setting is None:
        setting = (spec.get("elasticPolicy") or {}).get("nProcPerNode")
    nproc, why = nproc_of_container(setting, trainer)
    return Topology(replicas, nproc, why)


def valid_worker_counts(lanes: int, topo: Topology) -> list[int]:
    """Worker counts (>= 1) whose world size divides ``lanes``, for the job's other pods and
    ranks per pod."""
    if topo.nproc is None:
        return []
    sizes = set(valid_world_sizes(lanes))
    return [w for w in range(1, lanes + 1) if (topo.others + w) * topo.nproc in sizes]


def check_workers(lanes: int, topo: Topology, workers: int | None = None) -> None:
    """Raise :class:`ConfigError` unless the job (with ``workers`` Worker pods) splits ``lanes``.

    The message names the worker counts that would work, in the words of the user who typed
    ``kubectl scale --replicas``: "8 lanes cannot be split over 3 workers; use 1, 2, 4 or 8".
    """
    t = topo if workers is None else topo.with_workers(workers)
    if t.nproc is None:
        return  # undeterminable here: reported as a warning and a status condition instead
    world = t.pods * t.nproc
    if world == 0 or lanes % world == 0:
        return  # no pods at all is a stopped job, not a split
    options = valid_worker_counts(lanes, t)
    plain = t.others == 0 and t.nproc == 1
    what = (f"{t.workers} workers" if plain else
            f"{t.workers} workers (world size {world}: {t.pods} pods x {t.nproc} ranks)")
    if not options:
        raise ConfigError(f"{lanes} lanes cannot be split over {what}; no worker count works "
                          f"with {t.others} other pods and {t.nproc} ranks per pod")
    suffix = "" if plain else " workers"
    raise ConfigError(f"{lanes} lanes cannot be split over {what}; use {_or_list(options)}"
                      f"{suffix}")
