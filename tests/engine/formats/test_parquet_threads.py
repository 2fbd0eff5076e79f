"""The Parquet reader starts no thread of Arrow's own.

A Parquet file is read through a Python file object (``files.open_file``: ranged reads and the
plan's size check). With Arrow's defaults (``pre_buffer=True``, ``use_threads=True``) its I/O
and CPU pool threads read that file, so native threads call into Python; one alive at
interpreter exit aborted the process with "terminate called without an active exception"
(SIGABRT): a rank process of ``datalane demo`` (which reads Parquet) in about 1 of 50 runs on
a loaded machine. The count is taken in a fresh interpreter, before and after reading every
record of a file: the text column, and the columns of an image-caption source's parts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.paths import REPO

PROBE = textwrap.dedent("""
    import io, os, sys, threading
    import pyarrow as pa, pyarrow.parquet as pq
    from PIL import Image
    from datalane.engine.files import SourceFile
    from datalane.engine.formats import FORMATS, format_for
    from datalane.spec.recipe import load_recipe

    def native():  # OS threads that are no Python thread (numpy's BLAS ones included)
        return len(os.listdir("/proc/self/task")) - threading.active_count()

    def records(fmt, sf, field):
        reader = fmt.reader([sf], field)
        return sum(1 for c in fmt.cut(0, sf, 1 << 40, None) for _ in reader.records(c))

    folder = sys.argv[1]
    text = os.path.join(folder, "text.parquet")
    pq.write_table(pa.table({"text": [f"doc {i} " * 20 for i in range(2000)],
                             "n": list(range(2000))}), text, row_group_size=250)
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(png, "PNG")
    pairs = os.path.join(folder, "pairs.parquet")
    pq.write_table(pa.table({"jpg": [png.getvalue()] * 40, "txt": ["a cap"] * 40}), pairs,
                   row_group_size=10)
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 63,
                          "tokenizer": {"uri": sys.argv[2]}, "packing": {"algorithm": "bestfit"},
                          "sources": [{"name": "pairs", "uris": [pairs], "vision": {}}]})
    before = native()
    n = records(FORMATS["parquet"], SourceFile(text, os.path.getsize(text), "", "parquet", None),
                "text")
    m = records(format_for("parquet", recipe.sources[0]),
                SourceFile(pairs, os.path.getsize(pairs), "", "parquet", None), "jpg")
    print(n, m, before, native())
""")


def test_reading_parquet_starts_no_arrow_thread(tmp_path: Path) -> None:
    from tests.support.kinds import VISION_TOKENIZER

    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), str(VISION_TOKENIZER)],
                         capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    n, m, before, after = map(int, out.stdout.split())
    assert (n, m) == (2000, 40)
    assert after == before, f"{after - before} native threads started by reading Parquet"
