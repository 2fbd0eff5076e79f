"""Small datasets of every source format, written by each format's own tools.

MDS: the committed shards of ``tests/data/mds`` (written by MosaicML Streaming's ``MDSWriter``,
see ``make_mds.py``); WebDataset: ``webdataset.TarWriter``; Hugging Face: ``datasets``'
``save_to_disk``; Lance: ``lance.write_dataset``. Document ``i`` of a format is
``text_of(prefix, i)``, so a test can tell which documents came out, and how often, from the
tokens alone.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.data.make_mds import HERE as MDS_DATA
from tests.data.make_mds import TEXT_SAMPLES, text_of

__all__ = ["FormatData", "text_of", "write_hf", "write_lance", "write_mds", "write_tars"]


@dataclass(frozen=True)
class FormatData:
    """A dataset and the recipe source that reads it."""

    source: dict[str, Any]  # without name and weight
    prefix: str  # text_of(prefix, i) is document i
    ids: tuple[int, ...]  # the documents one epoch holds


def write_mds(root: Path) -> FormatData:
    """240 samples in 4 shards; the source names the dataset directory (format inferred)."""
    out = root / "mds"
    shutil.copytree(os.path.join(MDS_DATA, "text"), out)
    return FormatData({"uris": [str(out)], "chunk_rows": 20}, "mds",
                      tuple(range(TEXT_SAMPLES)))


def write_tars(root: Path, tars: int = 2, per_tar: int = 150) -> FormatData:
    """``tars`` tars of ``per_tar`` samples (a .txt, a .json, every 4th a .cls)."""
    import webdataset as wds

    out = root / "wds"
    out.mkdir()
    for t in range(tars):
        with wds.TarWriter(str(out / f"shard-{t:04d}.tar")) as w:
            for j in range(per_tar):
                i = t * per_tar + j
                sample: dict[str, Any] = {"__key__": f"s{i:06d}", "txt": text_of("wds", i),
                                          "json": {"id": i}}
                if i % 4 == 0:
                    sample["cls"] = i % 10
                w.write(sample)
    return FormatData({"uris": [str(out / "*.tar")], "text_field": "txt", "chunk_rows": 20},
                      "wds", tuple(range(tars * per_tar)))


def write_hf(root: Path, rows: int = 400) -> FormatData:
    """A ``save_to_disk`` directory of 2 Arrow files; the source declares ``format: hf``."""
    import datasets

    out = root / "hf"
    ds = datasets.Dataset.from_dict({"id": list(range(rows)),
                                     "text": [text_of("hf", i) for i in range(rows)]})
    datasets.disable_progress_bars()
    ds.save_to_disk(str(out), num_shards=2)
    return FormatData({"uris": [str(out)], "format": "hf", "chunk_rows": 25}, "hf",
                      tuple(range(rows)))


def write_lance(root: Path, rows: int = 300) -> FormatData:
    """3 fragments of 100 rows, rows with an id divisible by 50 deleted afterwards."""
    import lance
    import pyarrow as pa

    out = root / "docs.lance"
    table = pa.table({"id": list(range(rows)), "text": [text_of("lance", i) for i in range(rows)]})
    ds = lance.write_dataset(table, str(out), max_rows_per_file=100)
    ds.delete("id % 50 = 0")
    return FormatData({"uris": [str(out)], "chunk_rows": 20}, "lance",
                      tuple(i for i in range(rows) if i % 50))


WRITERS = {"mds": write_mds, "webdataset": write_tars, "hf": write_hf, "lance": write_lance}
