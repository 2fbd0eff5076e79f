"""The ``datalane`` command, run as a user runs it: a subprocess with real files."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def datalane(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "datalane.cli", *args], capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"datalane {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def _hashes(out: str) -> dict[int, str]:
    return {int(m[1]): m[2] for m in re.finditer(r"^step=(\d+) sha256=([0-9a-f]{64})$", out,
                                                  re.M)}


def test_run_prints_step_hashes_and_summary(write_recipe) -> None:
    out = datalane("run", write_recipe(), "--world", "2", "--steps", "5").stdout
    assert sorted(_hashes(out)) == [0, 1, 2, 3, 4]
    summary = out.strip().splitlines()[-1]
    for key in ("tokens=", "tokens_per_s=", "documents_read=", "skipped=",
                "padding_fraction="):
        assert key in summary


def test_run_to_the_end_reads_everything(write_recipe) -> None:
    out = datalane("run", write_recipe(), "--world", "4").stdout
    assert "documents_read=630 skipped=0 (none)" in out


def test_save_and_resume_on_another_world_continue_the_stream(write_recipe, tmp_path) -> None:
    recipe = write_recipe()
    state = tmp_path / "s.json"
    full = _hashes(datalane("run", recipe, "--world", "1", "--steps", "12").stdout)
    datalane("run", recipe, "--world", "2", "--steps", "7", "--save-state-at", "7",
             "--state-out", str(state))
    rest = _hashes(datalane("run", recipe, "--world", "8", "--workers", "3", "--steps", "5",
                            "--resume", str(state)).stdout)
    assert rest == {s: h for s, h in full.items() if s >= 7}

    shown = datalane("inspect", str(state)).stdout
    assert "checkpoint at step 7: lanes 8 of 8" in shown
    assert "lane 5: 14 sequences emitted" in shown
    assert "web: epoch 0, block" in shown
    assert re.search(r"resume point bytes per lane: max (\d+)", shown)
    assert int(re.search(r"max (\d+)", shown)[1]) < 1024


def test_resume_with_a_changed_recipe_names_the_field(write_recipe, tmp_path) -> None:
    state = tmp_path / "s.json"
    datalane("run", write_recipe(), "--steps", "2", "--save-state-at", "2",
             "--state-out", str(state))
    proc = datalane("run", write_recipe(seed=6), "--steps", "1", "--resume", str(state),
                    check=False)
    assert proc.returncode == 2
    assert "recipe.seed: saved 5, now 6" in proc.stderr


def test_verify_agrees_across_worlds_workers_and_resumes(write_recipe) -> None:
    proc = datalane("verify", write_recipe(), "--steps", "12", "--worlds", "1,2,4",
                    "--workers", "1,3", "--resume-at", "5,11")
    assert "OK: 18 runs" in proc.stdout
    assert "resume@5 on world=2 workers=1" in proc.stdout
    assert "DIFFERS" not in proc.stdout


def test_bad_world_is_refused_with_the_sizes_that_work(write_recipe) -> None:
    proc = datalane("run", write_recipe(), "--world", "3", "--steps", "1", check=False)
    assert proc.returncode == 2
    assert "8 lanes cannot be split over 3 ranks; use 1, 2, 4 or 8" in proc.stderr


@pytest.mark.slow
def test_demo_matches_across_4_2_and_8_rank_processes(tmp_path) -> None:
    proc = datalane("demo", "--steps", "2", "--dir", str(tmp_path))
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "MATCH"
    assert sum(1 for line in lines if line.rstrip().endswith("=")) == 6
