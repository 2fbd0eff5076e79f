"""What a training job means for the lanes: pods, ranks per pod and the data-parallel world size.

Two kinds of job (the registry is :mod:`datalane_operator.kinds`):

* **PyTorchJob** (Kubeflow training-operator v1, :func:`topology_of`): the training-operator
  runs ``replicas`` pods per replica type (``Master``, ``Worker``) and torchrun starts
  ``nprocPerNode`` ranks in each, so the job has ``(sum of replicas) x nprocPerNode`` ranks.
  ``nprocPerNode`` is ``auto``, ``gpu``, ``cpu`` or an integer (training-operator v1; the
  deprecated ``elasticPolicy.nProcPerNode`` is honoured); ``gpu`` and ``auto`` resolve to the
  trainer container's ``nvidia.com/gpu`` limit, ``cpu`` to an integer CPU limit, as torchrun
  would count them.
* **TrainJob** (Kubeflow Trainer v2 on JobSet, :func:`trainjob_topology_of`): the trainer runs
  ``spec.trainer.numNodes`` pods with ``spec.trainer.numProcPerNode`` ranks each (resolved the
  same way, from ``spec.trainer.resourcesPerNode``). Either field left out is the training
  runtime's to decide (``mlPolicy``), which the TrainJob alone does not tell: the world is then
  unknown and the guard is off, with a warning and a status condition saying which field to
  set.

Lanes are dealt to *data-parallel* (DP) ranks. Under the pipeline's
:class:`~datalane_operator.pipeline.Parallelism` (TP, PP, CP) the DP world size is
``ranks / (TP x PP x CP)``, with the ranks laid out as TorchTitan and Megatron-LM do: TP
innermost, then CP, then DP, PP outermost. So the TP x CP peers of a DP rank are consecutive
ranks and must share a pod (they read one sidecar session), and a pod must hold ranks of one
pipeline stage only (its ``nproc / (TP x CP)`` DP ranks are DP ranks of that stage).

The scale guard lives here: :func:`check_workers` refuses a worker count whose DP world size
exceeds the lanes (a DP rank owns at least one lane; any size from 1 to the lane count works,
ranks then owning floor or ceil of lanes / DP lanes) or does not fit the parallelism, naming
the counts that would work; :func:`lanes_per_rank` says how unevenly the lanes are dealt.
Pure functions over plain dicts (the objects as the API server sends them). Callers: the
admission verdicts, the reconciler and the webhook handlers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError
from datalane_operator.pipeline import Parallelism

__all__ = [
    "GPU_RESOURCE",
    "Topology",
    "check_workers",
    "lanes_per_rank",
    "nproc_of_container",
    "topology_of",
    "trainjob_topology_of",
    "trainer_container",
    "valid_worker_counts",
]

GPU_RESOURCE = "nvidia.com/gpu"
WORKER = "Worker"


def _or_list(values: list[int]) -> str:
    """"1, 2, 4 or 8"; a run of three or more consecutive values as "1 to 8"."""
    words: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            words.append(f"{values[i]} to {values[j]}")
        else:
            words.extend(str(v) for v in values[i:j + 1])
        i = j + 1
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def lanes_per_rank(lanes: int, dp: int) -> int | str:
    """Lanes a DP rank of ``dp`` owns: ``lanes / dp`` when it divides them, else the range
    "floor-ceil" (8 lanes over 3 ranks: "2-3")."""
    low, high = lanes // dp, -(-lanes // dp)
    return low if low == high else f"{low}-{high}"


@dataclass(frozen=True)
class Topology:
    """Pods and ranks of a job, and the parallelism of its pipeline.

    ``nproc`` is None when it cannot be known from the spec. ``unit`` is what the scaled
    pods are called in messages ("worker": PyTorchJob's Worker replicas; "node": a TrainJob's
    ``numNodes``).
    """

    replicas: Mapping[str, int]
    nproc: int | None
    nproc_source: str = ""
    parallelism: Parallelism = field(default_factory=Parallelism)
    unit: str = "worker"

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
    def ranks(self) -> int | None:
        """Trainer ranks (torchrun's world size): pods x nproc."""
        return None if self.nproc is None else self.pods * self.nproc

    @property
    def dp_size(self) -> int | None:
        """The data-parallel world size ranks / (TP x PP x CP); None if unknown or if the
        ranks are not a multiple of TP x PP x CP."""
        ranks, mp = self.ranks, self.parallelism.model_parallel
        return None if ranks is None or ranks % mp else ranks // mp

    @property
    def dp_ranks_per_pod(self) -> int | None:
        """Data-parallel ranks of one pod: nproc / (TP x CP) (what its sidecar serves)."""
        readers = self.parallelism.readers
        return None if self.nproc is None or self.nproc % readers else self.nproc // readers

    def with_workers(self, workers: int) -> Topology:
        replicas = dict(self.replicas)
        replicas[WORKER] = workers
        return Topology(replicas, self.nproc, self.nproc_source, self.parallelism, self.unit)

    def pod_problem(self) -> str | None:
        """Why no pod of this job can hold whole TP x CP groups (whatever the worker count),
        or None."""
        par = self.parallelism
        if self.nproc is None or self.nproc % par.readers == 0:
            return None
        inner = Parallelism(tensor=par.tensor, context=par.context)
        return (f"{_product(inner)} must divide the {self.nproc} ranks per pod "
                f"({self.nproc_source}): the TP and CP peers of a data-parallel rank read one "
                f"sidecar session, so they share a pod; use a multiple of {par.readers} ranks "
                f"per pod or change spec.parallelism")

    def mesh_problem(self) -> str | None:
        """Why these ranks do not fit the parallelism (not whole model replicas, or pods that
        span pipeline stages), or None. Assumes :meth:`pod_problem` is None."""
        par, ranks, nproc = self.parallelism, self.ranks, self.nproc
        if ranks is None or nproc is None or ranks == 0:
            return None
        mp = par.model_parallel
        if ranks % mp:
            return f"world size {ranks} ({self._split()}) is not a multiple of {_product(par)}"
        stage = ranks // par.pipeline
        if par.pipeline > 1 and stage % nproc:
            relation = "fewer than" if stage < nproc else "not a multiple of"
            return (f"a pipeline stage has {stage} ranks (world size {ranks} / PP "
                    f"{par.pipeline}), {relation} the {nproc} ranks of a pod, so a pod would "
                    f"hold ranks of several stages")
        return None

    def _split(self) -> str:
        return f"{self.pods} pods x {self.nproc} ranks"

    def describe(self) -> str:
        """"world size 6: 3 pods x 2 ranks, TP 2 -> DP 3" (the parallelism only if declared)."""
        text = f"world size {self.ranks}: {self._split()}"
        par = self.parallelism.describe()
        return f"{text}, {par} -> DP {self.dp_size}" if par and self.dp_size else text


def _workers(n: int, unit: str = "worker") -> str:
    return f"1 {unit}" if n == 1 else f"{n} {unit}s"


def _product(par: Parallelism) -> str:
    text = par.describe()
    return text if "x" not in text else f"{text} = {par.model_parallel}"


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


def topology_of(job: Mapping[str, Any], container: str = "pytorch",
                parallelism: Parallelism | None = None) -> Topology:
    """Pods per replica type and ranks per pod of a PyTorchJob object, under the pipeline's
    ``parallelism`` (none: pure data parallelism)."""
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
    return Topology(replicas, nproc, why, parallelism or Parallelism())


def trainjob_topology_of(job: Mapping[str, Any], container: str = "node",
                         parallelism: Parallelism | None = None) -> Topology:
    """Pods and ranks per pod of a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org
    v1alpha1): ``spec.trainer.numNodes`` pods of ``spec.trainer.numProcPerNode`` ranks.

    ``numProcPerNode`` resolves as for a PyTorchJob, against ``spec.trainer.resourcesPerNode``
    (the trainer container's resources; ``container`` is unused: a TrainJob carries no pod
    template). A field left out is the training runtime's: the ranks are then unknown.
    """
    del container
    trainer = (job.get("spec") or {}).get("trainer") or {}
    par = parallelism or Parallelism()
    nodes = trainer.get("numNodes")
    if nodes is None:
        return Topology({}, None, "spec.trainer.numNodes is not set, so the training runtime's "
                        "mlPolicy.numNodes decides the pods; set it in the TrainJob", par,
                        "node")
    setting = trainer.get("numProcPerNode")
    if setting is None:
        nproc: int | None = None
        why = ("spec.trainer.numProcPerNode is not set, so the training runtime's "
               "mlPolicy.torch.numProcPerNode decides the ranks per pod; set it in the TrainJob")
    else:
        nproc, why = nproc_of_container(setting, {"resources": trainer.get("resourcesPerNode")
                                                  or {}})
        why = why.replace("nprocPerNode", "numProcPerNode")
    return Topology({WORKER: int(nodes)}, nproc, why, par, "node")


def valid_worker_counts(lanes: int, topo: Topology) -> list[int]:
    """Worker counts (>= 1) whose DP world size is at most ``lanes`` and whose ranks fit the
    parallelism, for the job's other pods and ranks per pod."""
    nproc = topo.nproc
    if nproc is None or topo.pod_problem() is not None:
        return []
    mp = topo.parallelism.model_parallel
    out = []
    for dp in range(1, lanes + 1):
        pods, rest = divmod(dp * mp, nproc)
        workers = pods - topo.others
        if rest == 0 and workers >= 1 and topo.with_workers(workers).mesh_problem() is None:
            out.append(workers)
    return out


def check_workers(lanes: int, topo: Topology, workers: int | None = None) -> None:
    """Raise :class:`ConfigError` unless the job (with ``workers`` Worker pods) has at most
    ``lanes`` data-parallel ranks and fits the pipeline's parallelism.

    The message names the worker counts that would work, in the words of the user who typed
    ``kubectl scale --replicas``: "8 lanes cannot be split over 9 workers; use 1 to 8",
    "8 lanes cannot be split over 5 workers (world size 10: 5 pods x 2 ranks); use 1 to 4
    workers".
    """
    t = topo if workers is None else topo.with_workers(workers)
    if t.nproc is None:
        return  # undeterminable here: reported as a warning and a status condition instead
    if t.pods == 0:
        return  # no pods at all is a stopped job, not a split
    par = t.parallelism
    pod = t.pod_problem()
    if pod is not None:
        raise ConfigError(pod)
    mesh = t.mesh_problem()
    dp = t.dp_size
    if mesh is None and dp is not None and dp <= lanes:
        return
    options = valid_worker_counts(lanes, t)
    plain = t.others == 0 and t.nproc == 1 and par.model_parallel == 1
    if mesh is not None:
        verb = "does" if t.workers == 1 else "do"
        head = f"{_workers(t.workers, t.unit)} {verb} not fit {par.describe()}: {mesh}"
    else:
        what = (_workers(t.workers, t.unit) if plain
                else f"{_workers(t.workers, t.unit)} ({t.describe()})")
        head = f"{lanes} lanes cannot be split over {what}"
    if not options:
        with_par = f" under {par.describe()}" if par.model_parallel > 1 else ""
        raise ConfigError(f"{head}; no {t.unit} count works with {t.others} other pods and "
                          f"{t.nproc} ranks per pod{with_par}")
    suffix = "" if plain else f" {t.unit}s"
    raise ConfigError(f"{head}; use {_or_list(options)}{suffix}")
