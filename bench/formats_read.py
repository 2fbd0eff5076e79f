"""Read speed of the MDS, WebDataset, HF (Arrow) and Lance readers, records and decode only.

Writes the same documents (``--docs`` of about 500 bytes) in each format with that format's
own writer, then times datalane's reader over every chunk (``records`` + ``decode``, no
tokenizer) and, for MDS, MosaicML Streaming's own reader on the same shards when the
``streaming`` package can be imported (it is not a dependency; see tests/data/make_mds.py for
installing it beside the venv). Prints docs/s and MB/s of document text per reader::

    PYTHONPATH=/tmp/mds .venv/bin/python bench/formats_read.py --docs 200000
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats import FORMATS
from datalane.engine.formats.directories import directory_lister
from datalane.spec.formats import compression_of


def _texts(n: int) -> list[str]:
    rng = random.Random(5)
    words = ["river", "stone", "lamp", "orbit", "cedar", "pixel", "quartz", "meadow"]
    return [" ".join(rng.choice(words) for _ in range(80)) for _ in range(n)]


def _files(uri: str, fmt: str) -> list[SourceFile]:
    return [SourceFile(p, s, i, fmt, compression_of(p))
            for p, s, i in expand(uri, "bench", directory_lister(fmt))]


def _time_datalane(uri: str, fmt: str, field: str) -> tuple[float, int, int]:
    files = _files(uri, fmt)
    f = FORMATS[fmt]
    chunks = [c for i, sf in enumerate(files) for c in f.cut(i, sf, 1 << 20, None)]
    reader = f.reader(files, field)
    n = size = 0
    t0 = time.perf_counter()
    for c in chunks:
        for _, raw in reader.records(c):
            value = f.decode(raw, field)[0]
            n += 1
            size += len(value)
    return time.perf_counter() - t0, n, size


def _row(name: str, seconds: float, n: int, size: int) -> None:
    print(f"{name:<34} {n / seconds:>12,.0f} docs/s {size / seconds / 1e6:>9,.1f} MB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100_000)
    args = ap.parse_args()
    texts = _texts(args.docs)
    root = tempfile.mkdtemp(prefix="formats-bench-")
    runs: list[tuple[str, Callable[[], tuple[float, int, int]]]] = []
    try:
        from streaming import MDSWriter
        from streaming.base.format import reader_from_json

        with MDSWriter(out=f"{root}/mds", columns={"text": "str"}) as w:
            for t in texts:
                w.write({"text": t})
        runs.append(("mds: datalane", lambda: _time_datalane(f"{root}/mds", "mds", "text")))

        def streaming_reader() -> tuple[float, int, int]:
            import json

            with open(f"{root}/mds/index.json") as f:
                shards = json.load(f)["shards"]
            t0 = time.perf_counter()
            n = size = 0
            for shard in shards:
                r = reader_from_json(f"{root}/mds", None, shard)
                for i in range(shard["samples"]):
                    size += len(r.decode_sample(r.get_sample_data(i))["text"])
                    n += 1
            return time.perf_counter() - t0, n, size

        runs.append(("mds: streaming's MDSReader", streaming_reader))
    except ImportError:
        print("(mosaicml-streaming not importable: no MDS rows)")
    import webdataset as wds

    os.makedirs(f"{root}/wds")
    with wds.TarWriter(f"{root}/wds/a.tar") as tw:
        for i, t in enumerate(texts):
            tw.write({"__key__": f"k{i:08d}", "txt": t})
    runs.append(("webdataset: datalane", lambda: _time_datalane(f"{root}/wds/a.tar",
                                                                "webdataset", "txt")))

    def wds_own() -> tuple[float, int, int]:
        t0 = time.perf_counter()
        n = size = 0
        for s in wds.WebDataset(f"{root}/wds/a.tar", shardshuffle=False):
            size += len(s["txt"])
            n += 1
        return time.perf_counter() - t0, n, size

    runs.append(("webdataset: webdataset.WebDataset", wds_own))
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(f"{root}/hf")
    runs.append(("hf: datalane", lambda: _time_datalane(f"{root}/hf", "hf", "text")))

    def hf_own() -> tuple[float, int, int]:
        ds = datasets.load_from_disk(f"{root}/hf")
        t0 = time.perf_counter()
        n = size = 0
        for batch in ds.iter(batch_size=1000):
            for t in batch["text"]:
                size += len(t)
                n += 1
        return time.perf_counter() - t0, n, size

    runs.append(("hf: datasets.Dataset.iter", hf_own))
    try:
        import lance
        import pyarrow as pa

        lance.write_dataset(pa.table({"text": texts}), f"{root}/t.lance")
        runs.append(("lance: datalane", lambda: _time_datalane(f"{root}/t.lance", "lance",
                                                               "text")))
    except ImportError:
        print("(pylance not installed: no Lance row)")
    for name, run in runs:
        best = min((run() for _ in range(3)), key=lambda r: r[0])
        _row(name, *best)


if __name__ == "__main__":
    main()
