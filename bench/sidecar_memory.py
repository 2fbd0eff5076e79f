#!/usr/bin/env python3
"""Sidecar memory over a long run without checkpoints, on a recipe of many files (issue 9).

A session keeps the lane states of every step boundary since the last checkpoint (up to
4,096), so that the trainer may checkpoint any of them. Each kept boundary used to be the
whole checkpoint JSON, fingerprint document included - which lists every source file - so
memory grew with (steps since the last checkpoint) x (files). This benchmark runs a real
``datalane-sidecar serve`` process on a recipe of ``--files`` tiny JSONL files (generated in a
temporary folder), reads ``--steps`` steps through the shipped ``SidecarLoader`` without a
checkpoint, and samples the sidecar's resident memory (``VmRSS`` of ``/proc/<pid>/status``)
and its kept boundaries (count and bytes, from ``Stats``) every ``--every`` steps.

``--sidecar-path DIR`` puts DIR first on the sidecar's ``PYTHONPATH``: a folder holding another
``datalane_sidecar`` package (e.g. an older version taken with ``git show``) is measured on the
same recipe, for a before/after comparison. Results are printed and written to
``bench/results/sidecar_memory.json`` (``--out``).

    .venv/bin/python bench/sidecar_memory.py                       # 10,000 files, 10,000 steps
    .venv/bin/python bench/sidecar_memory.py --steps 2000 --sidecar-path /tmp/old-sidecar
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from datalane.client.sidecar import SidecarLoader
from datalane.corpus import tokenizer_path

HERE = Path(__file__).resolve().parent


def write_files(folder: str, n: int) -> str:
    """``n`` JSONL files of two short documents each; returns their glob."""
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"part-{i:06d}.jsonl"), "w", encoding="utf-8") as f:
            for j in range(2):
                f.write(json.dumps({"text": f"file {i} doc {j}: " + "lorem ipsum " * 4}) + "\n")
    return os.path.join(folder, "*.jsonl")


def write_recipe(folder: str, files_glob: str) -> str:
    path = os.path.join(folder, "recipe.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump({
            "lanes": 2, "global_batch_size": 2, "seq_len": 16, "seed": 7,
            "tokenizer": {"uri": tokenizer_path()},
            "sources": [{"name": "tiny", "uris": [files_glob], "epochs": None}],
            "shuffle": {"block_size": 16}}, f)
    return path


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def kept(loader: SidecarLoader) -> dict[str, int] | None:
    """The session's kept boundaries, as its Stats report them (None: a sidecar without)."""
    sessions = loader.stats()["sessions"]
    info = next(iter(sessions.values()))
    found: dict[str, int] | None = info.get("kept_boundaries")
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="datalane-memory-")
    t0 = time.perf_counter()
    recipe = write_recipe(folder, write_files(os.path.join(folder, "files"), args.files))
    made = time.perf_counter() - t0
    sock = os.path.join(folder, "dl.sock")
    env = dict(os.environ)
    if args.sidecar_path:
        env["PYTHONPATH"] = os.pathsep.join([args.sidecar_path, env.get("PYTHONPATH", "")])
    log = open(os.path.join(folder, "sidecar.log"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
                             sock, "--recipe", recipe, "--workers", str(args.workers)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    rows: list[dict[str, Any]] = []
    try:
        loader = SidecarLoader(sock, rank=0, world_size=1, microbatch_size=2,
                               transport="inline", open_timeout=300)
        it = iter(loader)
        start = time.perf_counter()
        for step in range(1, args.steps + 1):  # steps read so far
            next(it)  # one microbatch per step
            if step == 1 or step % args.every == 0:
                row = {"steps": step, "rss_mib": round(rss_mib(proc.pid), 1),
                       "seconds": round(time.perf_counter() - start, 1)}
                boundaries = kept(loader)
                if boundaries is not None:
                    row["kept_boundaries"] = boundaries["count"]
                    row["kept_bytes"] = boundaries["bytes"]
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        loader.close()
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
    return {"files": args.files, "steps": args.steps, "every": args.every,
            "sidecar_path": args.sidecar_path or "", "files_seconds": round(made, 1),
            "python": platform.python_version(), "load1": round(os.getloadavg()[0], 2),
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--sidecar-path", default="",
                    help="a folder with another datalane_sidecar package to measure")
    ap.add_argument("--out", default=str(HERE / "results" / "sidecar_memory.json"))
    args = ap.parse_args()
    result = run(args)
    rows = result["rows"]
    print(f"\n{result['files']} files, {result['steps']} steps without a checkpoint")
    print("| steps read | sidecar RSS (MiB) | kept boundaries | kept bytes | seconds |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['steps']:,} | {r['rss_mib']:,.1f} | {r.get('kept_boundaries', '-')} | "
              f"{r.get('kept_bytes', '-')} | {r['seconds']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
