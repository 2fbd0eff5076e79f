"""``datalane demo --sidecars``: the elastic demo through real sidecars, sockets and a store.

Phase 1 runs 2 pods x 2 ranks: one sidecar process per pod (``datalane-sidecar serve``), one
trainer process per rank that trains a tiny torch model on what its ``SidecarLoader`` streams
and asks for a checkpoint at the end of the phase; the sidecars write one object per pod to
the checkpoint store and the step is committed. Everything stops. Phase 2 resumes from the
committed step on 1 pod x 2 ranks, phase 3 on 4 pods x 2 ranks. The per-step global hashes,
composed from the lane digests the trainers received, are compared with an uninterrupted
in-process run; then the store's ledger is audited.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from datalane.demos.elastic import Progress, gather, lane_digests, print_comparison
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs

__all__ = ["run_sidecar_demo", "trainer_main"]

RANKS_PER_POD = 2
PHASES = (2, 1, 4)  # pods per phase


def trainer_main(args: argparse.Namespace) -> int:
    """One trainer process: ``--steps`` steps of a tiny model, digests out, then checkpoint."""
    import torch

    from datalane.client.sidecar import SidecarLoader
    from datalane.client.torch import to_tensors

    torch.manual_seed(args.rank)
    model = torch.nn.Sequential(torch.nn.Embedding(1024, 16), torch.nn.Linear(16, 1024))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = SidecarLoader(args.socket, rank=args.rank, world_size=args.world,
                           microbatch_size=args.microbatch, resume_step=args.resume_step)
    done = 0
    for batch in loader:
        t = to_tensors(batch)
        logits = model(t["input_ids"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t["labels"].flatten(),
                                                 ignore_index=-100)
        loss.backward()
        if batch.lane_digests:  # the last microbatch of the step
            optim.step()
            optim.zero_grad()
            print(json.dumps({"step": batch.step, "loss": round(float(loss.detach()), 4),
                              "lanes": {str(k): v.hex() for k, v in
                                        batch.lane_digests.items()}}), flush=True)
            done += 1
            if done == args.steps:
                break
    saved = loader.checkpoint()
    print(json.dumps({"checkpoint": saved}), flush=True)
    loader.close()
    return 0


def _start_sidecar(folder: str, recipe: str, store: str, pod: int) -> subprocess.Popen[bytes]:
    os.makedirs(folder, exist_ok=True)
    log = open(os.path.join(folder, "sidecar.log"), "wb")  # noqa: SIM115 - lives with the proc
    return subprocess.Popen(
        [sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
         os.path.join(folder, "datalane.sock"), "--recipe", recipe, "--store", store,
         "--pod", f"pod-{pod}", "--ranks-per-pod", str(RANKS_PER_POD), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT)


def _wait_serving(socket: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the sidecar for {socket} exited with {proc.returncode}; see "
                             f"{os.path.join(os.path.dirname(socket), 'sidecar.log')}")
        if subprocess.run([sys.executable, "-m", "datalane_sidecar", "probe", "--socket",
                           socket, "--timeout", "1"], capture_output=True,
                          check=False).returncode == 0:
            return
        time.sleep(0.3)
    raise SystemExit(f"the sidecar for {socket} is not serving after {timeout:.0f} s")


def _phase(root: str, recipe: str, store: str, pods: int, steps: int, resume: int | None,
           progress: Progress) -> dict[int, dict[int, bytes]]:
    world = pods * RANKS_PER_POD
    folders = [os.path.join(root, f"w{world}", f"pod-{p}") for p in range(pods)]
    sidecars = [_start_sidecar(f, recipe, store, p) for p, f in enumerate(folders)]
    trainers: list[subprocess.Popen[str]] = []
    try:
        for f, sc in zip(folders, sidecars, strict=True):
            _wait_serving(os.path.join(f, "datalane.sock"), sc)
        for rank in range(world):
            cmd = [sys.executable, "-m", "datalane.cli", "_trainer", "--socket",
                   os.path.join(folders[rank // RANKS_PER_POD], "datalane.sock"),
                   "--rank", str(rank), "--world", str(world), "--steps", str(steps),
                   "--microbatch", "2"]
            if resume is not None:
                cmd += ["--resume-step", str(resume)]
            trainers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))

        outputs = gather(trainers, progress, f"{pods} pods x {RANKS_PER_POD} ranks",
                         lambda line: '"lanes"' in line)
    finally:
        for sc in sidecars:
            sc.terminate()
        for sc in sidecars:
            sc.wait(timeout=60)
    return lane_digests(outputs)


def run_sidecar_demo(folder: str | None, steps: int, store: str | None,
                     keep: bool = False) -> int:
    from datalane.runner import run_world
    from datalane.spec.recipe import load_recipe
    from datalane.store import CheckpointStore
    from datalane.testing import make_corpus

    root = folder or tempfile.mkdtemp(prefix="datalane-sidecar-demo-")
    try:
        corpus = make_corpus(os.path.join(root, "corpus"))
        recipe = load_recipe(corpus.recipe)
        store_uri = store or os.path.join(root, "store")
        options = json.loads(os.environ.get("DATALANE_STORE_OPTIONS", "{}"))
        total = steps * len(PHASES)
        print(f"datalane demo --sidecars: {recipe.lanes} lanes, store {store_uri}")
        print("reference: 1 rank holding all lanes, in-process, uninterrupted ...", flush=True)
        reference = run_world(recipe, 1, Knobs(workers=2), total).hashes
        progress = Progress(sum(p * RANKS_PER_POD * steps for p in PHASES))
        elastic: dict[int, tuple[int, str]] = {}
        ckpts = CheckpointStore(store_uri, options or None)
        resume = None
        for pods in PHASES:
            world = pods * RANKS_PER_POD
            print(f"phase: {pods} pods x {RANKS_PER_POD} ranks (sidecar per pod)"
                  f"{f', resuming committed step {resume}' if resume is not None else ''}",
                  flush=True)
            digests = _phase(root, corpus.recipe, store_uri, pods, steps, resume, progress)
            for step, lanes in digests.items():
                elastic[step] = (world, global_hash(lanes[k] for k in sorted(lanes)))
            resume = ckpts.latest_committed()
            print(f"  committed checkpoint: step {resume}", flush=True)
        bad = print_comparison(reference, elastic, total)
        report = ckpts.audit()
        print(report.text(ledger=False))
        print("MATCH" if bad == 0 else f"MISMATCH ({bad} of {total} steps differ)")
        return 0 if bad == 0 else 1
    finally:
        if folder is None and not keep:
            shutil.rmtree(root, ignore_errors=True)
