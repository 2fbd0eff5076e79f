"""Generate the gRPC stubs from ``datalane.proto`` (``python -m datalane.wire.generate``).

The stubs are committed; ``tests/wire/test_wire.py`` regenerates them into a temporary folder
and fails if they differ from the committed files, so they can never drift from the proto.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = "datalane/wire/datalane.proto"
OUTPUTS = ("datalane_pb2.py", "datalane_pb2.pyi", "datalane_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under ``out_root/datalane/wire/``; returns their paths."""
    from grpc_tools import protoc

    (out_root / "datalane" / "wire").mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{ROOT}", f"--python_out={out_root}", f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}", str(ROOT / PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")
    return [out_root / "datalane" / "wire" / name for name in OUTPUTS]


if __name__ == "__main__":
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)  # noqa: T201
