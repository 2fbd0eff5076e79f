#!/usr/bin/env python3
"""Pre-tokenized throughput (issue 10 part 6): datalane against the memmap limit and Megatron.

    .venv/bin/python bench/pretokenized.py --rounds 3

One corpus of token ids (``--tokens``, default 50 M: documents of lognormal length, median
about 600 tokens, uint16 ids, each ending with EOS) is written once, byte for byte the same
tokens, as a Megatron dataset (``.idx`` + ``.bin``), a flat token file (``.u16``, boundary EOS)
and Parquet (a ``list<int32>`` column); it is cached in ``~/.cache/datalane``, keyed by this
file's generator settings. Every system delivers the whole corpus once as ``(B, seq_len + 1)``
batches (B 8, seq_len 2,048) and is timed from start to the last batch:

* ``memmap_limit``: the physical limit - ``np.memmap`` of the ``.bin`` copied into the packed
  int32 arrays, in file order, nothing else (no datalane);
* ``memmap_limit_contract``: the same plus what datalane's output contract adds to every step
  on its one ordered thread - the ``positions`` column (restarting at every document, from
  the index, and at every row) and the SHA-256 of both columns;
* ``datalane_<format>_workers_<k>``: ``Loader``, ``wrap`` packing, 2 lanes, shuffle blocks of
  1,024 documents, ``k`` map workers; everything is in the clock (planning, reading, checking
  every id against the vocabulary, shuffling, packing, hashing). ``..._batch_32``: the same
  with 32 sequences per step, 16 per lane window (as a global batch of 1,024 sequences on 64
  lanes gives; the cost of a window is partly per window, so larger ones deliver faster).
  ``parquet_pylist`` is the Parquet source with the integer-list fast path switched off (rows
  through ``to_pylist``);
* ``datalane_read_only_<format>``: datalane's map stages alone (read every chunk, decode,
  check, concatenate; one thread, no packing, no hash) - the part the token formats own
  (``parquet_pylist`` again without the fast path);
* ``megatron_gptdataset_ids``: megatron-core's ``GPTDataset`` (its own document / sample /
  shuffle indexes, built outside the clock) read sample by sample with
  ``_query_document_sample_shuffle_indices`` (index -> memmap slices -> concatenate) into the
  batch; ``megatron_gptdataset_getitem``: its ``__getitem__`` (tokens, labels, loss mask,
  position ids as torch tensors), what its DataLoader calls. Only when megatron-core imports.

With ``--s3`` (moto from the dev extra), the Megatron dataset is also put on moto's S3 server
on loopback: ``s3_read_limit`` fetches its ``.bin`` whole in one request (what the endpoint
serves at best, nothing else) and ``datalane_megatron_s3_workers_2`` reads it from there.

Each measurement is a fresh process; ``--rounds`` rounds interleave the systems and the
medians are reported with tokens/s, GB/s (of the ids as their 2 stored bytes), the share of
the memmap limit and tokens per CPU-second (all threads; steadier than wall time on a busy
machine, and the load average at each round's start is printed with the table). MosaicML
Streaming's reader on MDS shards plugs in through ``PEERS`` (another helper's format): a name
-> function ``(corpus dir) -> tokens delivered``.
Results: printed as a table, written to ``bench/results/pretokenized.json`` and drawn as
``docs/pretokenized-throughput.png`` (``--plot``).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

B, SEQ = 8, 2048
BIG_B = 32  # the larger batch: 16 sequences per lane window, as 1,024 sequences on 64 lanes
EOS = 1
SEED = 20261201
S3_BUCKET = "datalane-bench"

#: extra peers, run like the systems above: name -> fn(corpus dir) -> tokens delivered
PEERS: dict[str, Callable[[Path], int]] = {}


# -- the corpus ----------------------------------------------------------------------------------

def corpus_dir(tokens: int) -> Path:
    key = hashlib.sha256(f"{tokens}-{SEED}-lognormal(6.4,0.9)-v1".encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "datalane" / f"bench-pretokenized-{tokens}-{key}"


def make_corpus(out: Path, tokens: int) -> None:
    """Documents of lognormal length (median ~600), ids in [3, 1024), EOS last."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datalane.corpus import tokenizer_path
    from datalane.engine.formats.megatron import write_dataset

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    lengths: list[int] = []
    total = 0
    while total < tokens:
        lengths.append(int(np.clip(rng.lognormal(6.4, 0.9), 16, 16384)))
        total += lengths[-1]
    ids = rng.integers(3, 1024, size=total, dtype=np.uint16)
    ends = np.cumsum(lengths)
    ids[ends - 1] = EOS
    starts = np.concatenate([[0], ends[:-1]])
    docs = [ids[s:e] for s, e in zip(starts, ends, strict=True)]
    write_dataset(str(out / "corpus"), docs, "uint16")
    (out / "corpus.u16").write_bytes((out / "corpus.bin").read_bytes())
    offsets = np.concatenate([[0], ends]).astype(np.int64)
    pq_dir = out / "parquet"
    pq_dir.mkdir(exist_ok=True)
    per = 8192
    for f in range(0, len(docs), per * 4):
        part = slice(f, min(f + per * 4, len(docs)))
        flat = ids[offsets[part.start]:offsets[part.stop]].astype(np.int32)
        offs = (offsets[part.start:part.stop + 1] - offsets[part.start]).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offs), pa.array(flat))
        pq.write_table(pa.table({"input_ids": column}), pq_dir / f"{f // (per * 4):03d}.parquet",
                       row_group_size=1024)
    import shutil

    shutil.copyfile(tokenizer_path(), out / "tokenizer.json")
    (out / "MANIFEST.json").write_text(json.dumps({"tokens": total, "documents": len(docs)}))


def _streaming_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("streaming") is not None
    except ModuleNotFoundError:
        return False


def make_mds(out: Path) -> None:
    """The same documents as MDS shards, written by MosaicML Streaming's own ``MDSWriter``
    (column ``input_ids``, encoding ``ndarray:uint16``); only where ``streaming`` imports."""
    from streaming import MDSWriter

    from datalane.engine.formats.megatron import read_index

    mm = np.memmap(out / "corpus.bin", dtype=np.uint16, mode="r")
    idx = read_index(str(out / "corpus.idx"), str(out / "corpus.bin"), mm.nbytes)
    starts = idx.starts.tolist()  # n + 1 offsets
    tmp = out / "mds.tmp"
    with MDSWriter(out=str(tmp), columns={"input_ids": "ndarray:uint16"},
                   size_limit=1 << 26) as w:
        for lo, hi in itertools.pairwise(starts):
            w.write({"input_ids": np.asarray(mm[lo:hi])})
    tmp.rename(out / "mds")


# -- the systems ---------------------------------------------------------------------------------

def run_memmap(corpus: Path, contract: bool) -> int:
    import bisect
    import hashlib as h

    mm = np.memmap(corpus / "corpus.bin", dtype=np.uint16, mode="r")
    n = B * (SEQ + 1)
    out = np.empty((B, SEQ + 1), dtype=np.int32)
    pos = np.empty((B, SEQ + 1), dtype=np.int32)
    ar = np.arange(SEQ + 1, dtype=np.int32)
    starts: list[int] = []
    if contract:  # where each document starts, from the Megatron index
        from datalane.engine.formats.megatron import read_index

        idx = read_index(str(corpus / "corpus.idx"), str(corpus / "corpus.bin"), mm.nbytes)
        starts = idx.starts.tolist()
    delivered = 0
    for at in range(0, len(mm) - n + 1, n):
        out.reshape(-1)[:] = mm[at:at + n]
        if contract:  # positions restart at every document and every row; then the hash
            for r in range(B):
                lo = at + r * (SEQ + 1)
                hi = lo + SEQ + 1
                k = bisect.bisect_right(starts, lo)
                p = lo
                while p < hi:
                    e = min(starts[k], hi)
                    pos[r, p - lo:e - lo] = ar[:e - p]
                    p, k = e, k + 1
            d = h.sha256()
            d.update(out.data)
            d.update(pos.data)
            d.digest()
        delivered += n
    return delivered


def _recipe(corpus: Path, fmt: str, batch: int = B) -> Any:
    from datalane import load_recipe

    source: dict[str, Any] = {
        "megatron": {"uris": [str(corpus / "corpus.idx")]},
        "flatbin": {"uris": [str(corpus / "corpus.u16")], "tokens": {"boundary": EOS}},
        "parquet": {"uris": [str(corpus / "parquet" / "*.parquet")]},
        "mds": {"uris": [str(corpus / "mds")], "format": "mds",
                "tokens": {"field": "input_ids"}},
        # the Megatron dataset on the --s3 endpoint (moto's server on loopback)
        "megatron_s3": {"uris": [f"s3://{S3_BUCKET}/corpus.idx"]},
    }[fmt]
    source.setdefault("tokens", {})
    return load_recipe({
        "lanes": 2, "global_batch_size": batch, "seq_len": SEQ, "seed": 1234,
        "tokenizer": {"uri": str(corpus / "tokenizer.json")},
        "sources": [{"name": "ids", "epochs": 1, **source}],
        "packing": {"algorithm": "wrap"}, "shuffle": {"block_size": 1024},
    })


def run_datalane(corpus: Path, fmt: str, workers: int, batch: int = B) -> int:
    from datalane import Knobs, Loader

    if fmt == "parquet_pylist":
        from datalane.engine.formats import parquet

        parquet._id_lists = lambda column: None  # type: ignore[assignment]
        fmt = "parquet"
    delivered = 0
    with Loader(_recipe(corpus, fmt, batch), 0, 1, Knobs(workers=workers)) as loader:
        while True:
            step = loader.next_step()  # (its lane digests are computed before it returns)
            positions = step.positions
            # padding only ever ends a row (positions -1 after its last piece): a step whose
            # rows all end in a token delivered all of them (counted as the peers count theirs,
            # not scanned; the last steps are)
            if int(positions[:, -1].min()) >= 0:
                delivered += positions.size
            else:
                delivered += int((positions >= 0).sum())
            if step.ended:
                break
    return delivered


def run_read_only(corpus: Path, fmt: str) -> int:
    from datalane.engine.chunks import RecordReader
    from datalane.engine.formats import format_for
    from datalane.engine.plan import Plan

    if fmt == "parquet_pylist":
        from datalane.engine.formats import parquet

        parquet._id_lists = lambda column: None  # type: ignore[assignment]
        fmt = "parquet"

    plan = Plan.build(_recipe(corpus, fmt))
    sp = plan.sources[0]
    stage = plan.map_stages()[0]
    reader = RecordReader(sp.files, sp.source.field, sp.source)
    formats = [format_for(f.format, sp.source) for f in sp.files]
    delivered = 0
    batch: list[tuple[int, int, Any]] = []
    for chunk in sp.chunks:
        for pos, raw in reader.records(chunk):
            batch.append((chunk.file, pos, raw))
            if len(batch) == 256:
                delivered += len(stage.run(batch, formats).tokens)
                batch = []
    if batch:
        delivered += len(stage.run(batch, formats).tokens)
    reader.close()
    return delivered


def run_streaming_mds(corpus: Path) -> int:
    """MosaicML Streaming's own shard reader over the MDS copy: every sample decoded
    (``reader_from_json``, ``get_sample_data``, ``decode_sample``), the documents concatenated
    and cut into the ``(B, seq_len + 1)`` int32 batch in file order (no shuffle, no positions,
    no hash: its DataLoader side is left out)."""
    from streaming.base.format import reader_from_json

    shards = json.loads((corpus / "mds" / "index.json").read_text())["shards"]
    n = B * (SEQ + 1)
    out = np.empty(n, dtype=np.int32)
    have = 0
    delivered = 0
    for shard in shards:
        reader = reader_from_json(str(corpus / "mds"), None, shard)
        for i in range(shard["samples"]):
            ids = reader.decode_sample(reader.get_sample_data(i))["input_ids"]
            while len(ids):
                take = min(len(ids), n - have)
                out[have:have + take] = ids[:take]
                have += take
                ids = ids[take:]
                if have == n:
                    delivered += n
                    have = 0
    return delivered


class _Tok:
    """The few tokenizer attributes GPTDataset reads."""


def _gpt_dataset(corpus: Path) -> Any:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
    from megatron.core.datasets.utils import Split

    class Tok(MegatronLegacyTokenizer):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__("bench")

        def tokenize(self, text: str) -> Any:
            raise NotImplementedError

        vocab = property(lambda self: {})
        inv_vocab = property(lambda self: {})
        vocab_size = property(lambda self: 1024)
        eod = property(lambda self: EOS)
        pad = property(lambda self: 2)

    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=SEQ, split="100,0,0", tokenizer=Tok(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, path_to_cache=str(corpus / "megatron-cache"))
    indexed = IndexedDataset(str(corpus / "corpus"))
    return GPTDataset(indexed, str(corpus / "corpus"),
                      np.arange(len(indexed), dtype=np.int32), None, Split.train, config)


def run_megatron(ds: Any, getitem: bool) -> int:
    out = np.empty((B, SEQ + 1), dtype=np.int64)
    delivered = 0
    n = len(ds)
    for s in range(0, n - B + 1, B):
        if getitem:
            for r in range(B):
                ds[s + r]
        else:
            for r in range(B):
                out[r] = ds._query_document_sample_shuffle_indices(s + r)[0]
        delivered += B * (SEQ + 1)
    return delivered


def one(corpus: Path, system: str) -> list[dict[str, Any]]:
    """Measure one system (or, for Megatron, both variants) in this process."""
    import fsspec  # noqa: F401  imports stay out of every clock (datalane opens files with it)
    import pyarrow.parquet  # noqa: F401
    import tokenizers  # noqa: F401

    import datalane.engine.loader  # noqa: F401

    results = []

    def record(name: str, tokens: int, seconds: float, cpu: float) -> None:
        results.append({"name": name, "tokens": tokens, "seconds": round(seconds, 4),
                        "tokens_per_s": round(tokens / seconds, 1),
                        "tokens_per_cpu_s": round(tokens / max(cpu, 1e-9), 1)})

    def timed(name: str, fn: Callable[[], int]) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = fn()
        record(name, tokens, time.perf_counter() - t0, time.process_time() - c0)

    if system.startswith("memmap_limit"):
        contract = system.endswith("contract")
        # the limit is fast: run it over the corpus several times, report the total rate
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = 0
        while time.perf_counter() - t0 < 2.0:
            tokens += run_memmap(corpus, contract)
        record(system, tokens, time.perf_counter() - t0, time.process_time() - c0)
    elif system.startswith("datalane_read_only_"):
        fmt = system.removeprefix("datalane_read_only_")
        timed(system, lambda: run_read_only(corpus, fmt))
    elif system.startswith("datalane_"):
        fmt, _, workers = system.removeprefix("datalane_").rpartition("_workers_")
        workers, _, batch = workers.partition("_batch_")
        timed(system, lambda: run_datalane(corpus, fmt, int(workers), int(batch or B)))
    elif system == "s3_read_limit":
        import s3fs

        # the limit of the endpoint: the .bin fetched whole in one request, nothing else
        timed(system, lambda: len(s3fs.S3FileSystem().cat_file(
            f"{S3_BUCKET}/corpus.bin")) // 2)
    elif system == "streaming_mds_reader":
        timed(system, lambda: run_streaming_mds(corpus))
    elif system == "megatron":
        ds = _gpt_dataset(corpus)  # indexes built (and cached) outside the clock
        timed("megatron_gptdataset_ids", lambda: run_megatron(ds, False))
        timed("megatron_gptdataset_getitem", lambda: run_megatron(ds, True))
    elif system in PEERS:
        timed(system, lambda: PEERS[system](corpus))
    else:
        raise SystemExit(f"unknown system {system!r}")
    return results


def _serve_s3(corpus: Path) -> None:
    """Start moto's S3 server on a free loopback port for the rest of this process, put the
    Megatron dataset there, and point the measuring processes at it (the environment)."""
    import atexit
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(proc.terminate)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(endpoint + "/", timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit("moto's S3 server did not start (is the dev extra installed?)")
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.mkdir(S3_BUCKET)
    for name in ("corpus.idx", "corpus.bin"):
        fs.put(str(corpus / name), f"{S3_BUCKET}/{name}")


def _megatron_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=50_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one system
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "pretokenized.json"))
    ap.add_argument("--s3", action="store_true",
                    help="also read the Megatron dataset from S3: moto's server on loopback "
                         "(the dev extra), against fetching the same bytes in one request")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "pretokenized-throughput.png"),
                    help="the bar chart of the table (matplotlib, from the dev extra)")
    args = ap.parse_args()
    if args.one:
        for rec in one(Path(args.corpus), args.one):
            print(json.dumps(rec), flush=True)
        return
    corpus = corpus_dir(args.tokens)
    if not (corpus / "MANIFEST.json").exists():
        print(f"writing the corpus to {corpus} ...", file=sys.stderr)
        make_corpus(corpus, args.tokens)
    manifest = json.loads((corpus / "MANIFEST.json").read_text())
    mds = _streaming_importable()
    if mds and not (corpus / "mds" / "index.json").exists():
        print("writing the MDS shards with Streaming's MDSWriter ...", file=sys.stderr)
        make_mds(corpus)
    systems = ["memmap_limit", "memmap_limit_contract"]
    for fmt in ("megatron", "flatbin", "parquet") + (("mds",) if mds else ()):
        systems += [f"datalane_{fmt}_workers_1", f"datalane_{fmt}_workers_2",
                    f"datalane_{fmt}_workers_2_batch_{BIG_B}"]
    systems += ["datalane_parquet_pylist_workers_2", "datalane_read_only_megatron",
                "datalane_read_only_flatbin", "datalane_read_only_parquet",
                "datalane_read_only_parquet_pylist"]
    if _megatron_installed():
        systems.append("megatron")
    if mds:
        systems.append("streaming_mds_reader")
    else:
        print("(mosaicml-streaming not importable: no MDS rows; see tests/data/make_mds.py)",
              file=sys.stderr)
    systems += list(PEERS)
    if args.s3:
        _serve_s3(corpus)
        systems += ["s3_read_limit", "datalane_megatron_s3_workers_2"]
    runs: dict[str, list[float]] = {}
    cpu_runs: dict[str, list[float]] = {}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds} (load average {loads[-1]:.1f})", file=sys.stderr)
        for system in systems:
            proc = subprocess.run([sys.executable, __file__, "--one", system, "--corpus",
                                   str(corpus)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"{system} failed:\n{proc.stderr[-3000:]}")
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    runs.setdefault(rec["name"], []).append(rec["tokens_per_s"])
                    cpu_runs.setdefault(rec["name"], []).append(rec["tokens_per_cpu_s"])
                    print(f"  {rec['name']:<36} {rec['tokens_per_s'] / 1e6:9.1f} M tokens/s",
                          file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_runs.items()}
    limit = med["memmap_limit"]
    rows = []
    for name, v in med.items():
        rows.append({"name": name, "tokens_per_s": round(v, 1), "gb_per_s": round(v * 2 / 1e9, 3),
                     "of_limit": round(v / limit, 4), "tokens_per_cpu_s": round(cpu[name], 1),
                     "rounds": runs[name]})
    best_dl = max(v for k, v in med.items()
                  if k.startswith("datalane_") and "read_only" not in k and "pylist" not in k)
    peers = {k: v for k, v in med.items()
             if k.startswith(("megatron", "streaming")) or k in PEERS}
    summary = {"best_datalane_of_limit": round(best_dl / limit, 4),
               "best_datalane_of_contract_limit": round(best_dl / med["memmap_limit_contract"], 4),
               "best_datalane_over_best_peer": round(best_dl / max(peers.values()), 3)
               if peers else None}
    if "s3_read_limit" in med:
        summary["datalane_s3_of_s3_limit"] = round(
            med["datalane_megatron_s3_workers_2"] / med["s3_read_limit"], 4)
    print(f"\ncorpus: {manifest['tokens']:,} tokens in {manifest['documents']:,} documents; "
          f"B {B}, seq_len {SEQ}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; median of {args.rounds} interleaved rounds; load average "
          f"at the rounds' starts {', '.join(f'{x:.1f}' for x in loads)}\n")
    print("| system | M tokens/s | GB/s | of memmap limit | M tokens per CPU-second |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['name']} | {row['tokens_per_s'] / 1e6:,.1f} | {row['gb_per_s']:.3f} | "
              f"{row['of_limit'] * 100:.1f}% | {row['tokens_per_cpu_s'] / 1e6:,.1f} |")
    print("\n" + json.dumps(summary))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"corpus": manifest, "rows": rows, "summary": summary,
                                          "rounds": args.rounds, "load_average": loads},
                                         indent=1))
    plot(rows, args.plot, f"{manifest['tokens'] / 1e6:,.0f} M pre-tokenized tokens, "
         f"seq_len {SEQ}; {os.cpu_count()} CPUs; median of {args.rounds} rounds")


def plot(rows: list[dict[str, Any]], path: str, subtitle: str) -> None:
    """M tokens/s of every row as horizontal bars (log scale: the memmap copy is far ahead),
    datalane's delivering rows in one colour, the peers in another, the limits in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if "read_only" not in r["name"]]
    shown.sort(key=lambda r: r["tokens_per_s"])

    def colour(name: str) -> str:
        if name.startswith("memmap") or name.endswith("_limit"):
            return "#9e9e9e"
        return "#1f77b4" if name.startswith("datalane") else "#ff7f0e"

    fig, ax = plt.subplots(figsize=(9, 0.32 * len(shown) + 1.4))
    values = [r["tokens_per_s"] / 1e6 for r in shown]
    ax.barh(range(len(shown)), values, color=[colour(r["name"]) for r in shown])
    ax.set_yticks(range(len(shown)), [r["name"] for r in shown], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("M tokens/s (log scale)")
    for i, v in enumerate(values):
        ax.text(v * 1.05, i, f"{v:,.1f}", va="center", fontsize=7)
    ax.set_xlim(right=max(values) * 3)
    ax.set_title("Pre-tokenized throughput: datalane (blue), peers (orange), limits (grey)\n"
                 + subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
