"""torch.distributed.checkpoint across ranks and world sizes, with real multi-process jobs.

A gloo job of W processes saves datalane's data state with ``dcp.save``; a job of W'
processes loads it with ``dcp.load`` and every rank must continue at exactly the next
microbatch of the uninterrupted run of world size W' - in-process and through a sidecar.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datalane import load_recipe
from datalane.client import InProcessLoader
from datalane.client.torch import DataLaneDataset

pytestmark = pytest.mark.slow  # torchrun jobs on gloo

JOB = Path(__file__).with_name("dcp_job.py")
MICROBATCH = 2  # B = 16: a rank of W has 16 / W / 2 microbatches per step
STEPS_BEFORE = 3
FOLLOW = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(world: int, tmp: Path, tag: str, *args: str, job: str = JOB.name) -> list[Any]:
    """Run ``world`` ranks of a job script beside this file (torchrun's environment on
    loopback); returns what each rank wrote to its ``--out`` file."""
    port = _free_port()
    procs, outs = [], []
    for rank in range(world):
        out = tmp / f"{tag}-rank{rank}.json"
        outs.append(out)
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(JOB.with_name(job)), "--out",
                                       str(out), *args],
                                      env=env, stderr=subprocess.PIPE, text=True))
    errors = []
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        if p.returncode:
            errors.append(f"rank {rank} exited {p.returncode}:\n{err[-3000:]}")
    if errors:
        raise JobFailed("\n".join(errors))
    return [json.loads(o.read_text()) for o in outs]


class JobFailed(AssertionError):
    pass


def uninterrupted(recipe_path: str, world: int, skip: int, n: int) -> list[list[list[str]]]:
    """What each rank of ``world`` reads after ``skip`` microbatches of an uninterrupted run."""
    recipe = load_recipe(recipe_path)
    out = []
    for rank in range(world):
        loader = InProcessLoader(recipe, rank, world, MICROBATCH)
        it = iter(DataLaneDataset(loader))
        for _ in range(skip):
            next(it)
        out.append([[hashlib.sha256(mb["input_ids"].numpy().tobytes()).hexdigest(),
                     hashlib.sha256(mb["labels"].numpy().tobytes()).hexdigest()]
                    for mb in (next(it) for _ in range(n))])
        loader.close()
    return out


def per_step(world: int) -> int:
    return 16 // world // MICROBATCH


WORLDS = [(2, 1), (1, 2), (4, 2), (2, 4)]


@pytest.mark.parametrize(("before", "after"), WORLDS, ids=[f"{a}to{b}" for a, b in WORLDS])
def test_dcp_in_process_resumes_on_another_world_size(repeat_recipe, tmp_path, before,
                                                      after) -> None:
    ckpt = str(tmp_path / "ckpt")
    common = ["--recipe", repeat_recipe, "--microbatch", str(MICROBATCH), "--ckpt", ckpt]
    run_job(before, tmp_path, "save", *common,
            "--save-after", str(STEPS_BEFORE * per_step(before)), "--follow", "1")
    got = run_job(after, tmp_path, "load", *common, "--follow", str(FOLLOW))
    assert got == uninterrupted(repeat_recipe, after, STEPS_BEFORE * per_step(after), FOLLOW)


@pytest.mark.parametrize(("before", "after"), WORLDS, ids=[f"{a}to{b}" for a, b in WORLDS])
def test_dcp_through_a_sidecar_resumes_on_another_world_size(repeat_recipe, sidecar, tmp_path,
                                                             before, after) -> None:
    sc = sidecar(repeat_recipe)
    ckpt = str(tmp_path / "ckpt")
    common = ["--recipe", repeat_recipe, "--socket", sc.socket, "--microbatch",
              str(MICROBATCH), "--ckpt", ckpt]
    run_job(before, tmp_path, "save", *common,
            "--save-after", str(STEPS_BEFORE * per_step(before)), "--follow", "1")
    got = run_job(after, tmp_path, "load", *common, "--follow", str(FOLLOW))
    assert got == uninterrupted(repeat_recipe, after, STEPS_BEFORE * per_step(after), FOLLOW)


def test_dcp_inside_a_step_resumes_on_its_own_world_and_is_refused_on_another(
        repeat_recipe, tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt")
    common = ["--recipe", repeat_recipe, "--microbatch", str(MICROBATCH), "--ckpt", ckpt]
    inside = STEPS_BEFORE * per_step(2) + 1  # one microbatch into step 3
    run_job(2, tmp_path, "save", *common, "--save-after", str(inside), "--follow", "1")
    got = run_job(2, tmp_path, "same", *common, "--follow", str(FOLLOW))
    assert got == uninterrupted(repeat_recipe, 2, inside, FOLLOW)
    with pytest.raises(JobFailed, match=r"ConfigError: the client state is inside step 3 "
                                        r"\(1 microbatches of 2 sequences consumed at world "
                                        r"size 2\); it resumes only with world size 2"):
        run_job(1, tmp_path, "other", *common, "--follow", "1")
