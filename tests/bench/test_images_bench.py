"""bench/images.py runs: its quick mode serves the generated JPEG corpus through a real lane
(one and two map workers, and the client's ``to_vlm``), so the benchmark cannot rot."""

from __future__ import annotations

import pytest

from bench import images

pytestmark = pytest.mark.slow  # about 10 s: the corpus, the warm-up and torch's import


def test_quick_mode_runs_every_image_through_a_real_lane(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = {str(r["peer"]): r for r in images.main(["--quick"])}
    assert set(rows) == {"datalane-1", "datalane-2", "datalane+to_vlm-1",
                         "calibration-sha256-1", "calibration-sha256-2"}
    lane = rows["datalane-1"]
    # every image of the corpus, each to its placeholder run, whatever the workers
    assert lane["images"] == rows["datalane-2"]["images"] == 16
    assert lane["vision_tokens"] == rows["datalane+to_vlm-1"]["vision_tokens"] > 16 * 64
    # uint8 patch rows of one frame (768 bytes) against to_vlm's float32 of two (6,144)
    assert int(rows["datalane+to_vlm-1"]["out_bytes_per_image"]) >= \
        8 * int(lane["out_bytes_per_image"])
    out = capsys.readouterr().out
    assert "| datalane-2 |" in out and "load_average" in out
