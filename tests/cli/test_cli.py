"""The ``datalane`` command, run as a user runs it: a subprocess with real files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the CLI end to end, in subprocesses


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
    summary = out.strip().splitlines()[-2]
    for key in ("tokens=", "tokens_per_s=", "documents_read=", "skipped=",
                "padding_fraction="):
        assert key in summary


def _mixture(out: str) -> dict[str, tuple[float, float]]:
    line = out.strip().splitlines()[-1]
    assert line.startswith("mixture: "), line
    return {m[1]: (float(m[2]), float(m[3]))
            for m in re.finditer(r"(\w+)=([0-9.]+) \(weight ([0-9.]+)\)", line)}


def test_run_reports_the_realized_mixture_next_to_the_weights(write_recipe, tmp_path) -> None:
    """web 0.7 / code 0.3 by tokens: the mixture's choice keeps every source within one
    document of its share, so after a few thousand tokens the shares are near the weights;
    and the counts are restored with the lanes, so a resumed run reports the same shares."""
    recipe = write_recipe()
    mix = _mixture(datalane("run", recipe, "--world", "2", "--steps", "30").stdout)
    assert set(mix) == {"web", "code"}
    assert mix["web"][1] == 0.7 and mix["code"][1] == 0.3
    assert abs(mix["web"][0] + mix["code"][0] - 1) < 1e-3
    # the mixture takes the next document from the source furthest below its weight, so in
    # each lane a source is at most one document over its share: with 8 lanes the shares are
    # within 8 of the longest documents of the weights (over a short prefix that is far
    # from exact by fraction, which is why the report exists)
    from datalane.runner import run_world
    from datalane.spec.knobs import Knobs
    from datalane.spec.recipe import load_recipe

    r = load_recipe(recipe)
    run = run_world(r, 1, Knobs(workers=2), 150)
    total = sum(run.mixture)
    longest = 6001  # tokens: a code document has at most 6,000 characters, plus its EOS
    assert abs(run.mixture[0] / total - 0.7) <= 8 * longest / total
    assert abs(run.mixture[0] / total - 0.7) < abs(mix["web"][0] - 0.7) + 1e-9
    whole = _mixture(datalane("run", recipe, "--world", "1", "--steps", "12").stdout)
    state = tmp_path / "s.json"
    datalane("run", recipe, "--world", "2", "--steps", "5", "--save-state-at", "5",
             "--state-out", str(state))
    rest = _mixture(datalane("run", recipe, "--world", "4", "--steps", "7", "--resume",
                             str(state)).stdout)
    assert rest == whole


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


def test_verify_runs_the_map_stages_in_processes_too(write_recipe) -> None:
    proc = datalane("verify", write_recipe(), "--steps", "6", "--worlds", "2,1",
                    "--workers", "2", "--map-processes", "2")
    assert "OK: 3 runs" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if "map_processes" in x]
    assert line.startswith("world=2 map_processes=2") and "6/6" in line and " ok " in line
    refused = datalane("verify", write_recipe(), "--steps", "2", "--map-processes", "-1",
                       check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "knobs.map_processes -1 must be >= 0" in refused.stderr


def test_bad_world_is_refused_with_the_sizes_that_work(write_recipe) -> None:
    proc = datalane("run", write_recipe(), "--world", "9", "--steps", "1", check=False)
    assert proc.returncode == 2
    assert ("8 lanes cannot be split over 9 ranks (a rank owns at least one lane); use a world "
            "size of 1 to 8") in proc.stderr


def test_demo_matches_across_4_2_and_8_rank_processes(tmp_path) -> None:
    proc = datalane("demo", "--steps", "2", "--dir", str(tmp_path))
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "MATCH"
    assert sum(1 for line in lines if line.rstrip().endswith("=")) == 6


# -- bad inputs: one line naming the value, exit code 2, nothing run ---------------------------


def _refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (no traceback, no step run)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [("--world", "0"), ("--world", "-2"),
                                             ("--steps", "0"), ("--steps", "-1")])
def test_run_refuses_a_world_or_step_count_below_one(write_recipe, flag, value) -> None:
    line = _refused(datalane("run", write_recipe(), flag, value, check=False))
    assert line == (f"datalane run: error: argument {flag}: {value} is not at least 1 (see "
                    f"datalane run --help)")


def test_run_checks_the_state_output_before_running(write_recipe, tmp_path) -> None:
    missing = tmp_path / "no-such-folder" / "s.json"
    line = _refused(datalane("run", write_recipe(), "--steps", "3", "--save-state-at", "3",
                             "--state-out", str(missing), check=False))
    assert line == (f"datalane run: error: --state-out {missing}: the folder {missing.parent} "
                    f"does not exist")
    line = _refused(datalane("run", write_recipe(), "--steps", "3", "--save-state-at", "5",
                             "--state-out", str(tmp_path / "s.json"), check=False))
    assert line == ("datalane run: error: --save-state-at 5 lies outside this run, which saves "
                    "boundaries 0 to 3")
    assert not (tmp_path / "s.json").exists()


def test_run_refuses_damaged_state_files_in_one_line(write_recipe, tmp_path) -> None:
    state = tmp_path / "s.json"
    datalane("run", write_recipe(), "--steps", "2", "--save-state-at", "2",
             "--state-out", str(state))
    unsealed = json.loads(state.read_text())
    del unsealed["sha256"]
    cases = {
        "lanes-list.json": json.dumps({**unsealed, "lanes": [1, 2]}),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "step.json": state.read_text().replace('"step":2', '"step":-1'),
    }
    expected = {
        "lanes-list.json": ": lanes must be an object of lane number -> lane state, "
                           "got list [1, 2]",
        "deep.json": "is nested deeper than 64 levels; no datalane file is",
        "step.json": "fails its integrity check: it carries sha256 ",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        line = _refused(datalane("run", write_recipe(), "--steps", "1", "--resume", str(path),
                                 "--allow-unsealed-state", check=False))
        assert line.startswith(f"datalane run: error: state file {path}"), line
        assert expected[name] in line, line
    latin = tmp_path / "latin1.json"
    latin.write_bytes(state.read_bytes().replace(b'"step"', b'"st\xe9p"'))
    line = _refused(datalane("inspect", str(latin), check=False))
    offset = state.read_bytes().index(b'"step"') + 3
    assert line == (f"datalane inspect: error: state file {latin} is not UTF-8 text: byte 0xe9 "
                    f"at offset {offset}")


def test_demo_trainer_refuses_a_negative_resume_step() -> None:
    line = _refused(datalane("_trainer", "--socket", "/nonexistent", "--rank", "0", "--world",
                             "1", "--steps", "1", "--resume-step", "-1", check=False))
    assert line == ("datalane _trainer: error: argument --resume-step: -1 is not at least 0 "
                    "(see datalane _trainer --help)")


def test_audit_of_a_store_that_does_not_exist_fails_naming_it(tmp_path) -> None:
    """An audit of a missing store fails naming it (it printed 'OK: 0 checkpoints verified'
    and exited 0)."""
    proc = datalane("audit", str(tmp_path / "typo"), check=False)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-2:] == [
        f"problem: there is no checkpoint store at file://{tmp_path}/typo: nothing is stored "
        f"under it (check the URI, and the bucket and prefix)",
        "FAILED: 1 problems"]
    assert "OK" not in proc.stdout
