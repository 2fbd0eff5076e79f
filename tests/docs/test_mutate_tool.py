"""tools/mutate.py: the mutants it makes are the one-line slips it documents, each applied
alone, and a mutant the tests pass is reported as a survivor."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import REPO
from tools.mutate import mutants

SOURCE = '''\
__all__ = ["f"]


def f(a, b):
    """Doc."""
    if a < b and not a:
        a += 1
    return a + 2
'''


def test_every_documented_slip_once_each_alone() -> None:
    got = sorted((m.line, m.what) for m, _ in mutants(SOURCE, None))
    assert got == sorted([
        (6, "Lt -> LtE"), (6, "And -> Or"), (6, "not dropped"),
        (7, "Add= -> Sub="), (7, "1 -> 2"), (7, "AugAssign -> pass"),
        (8, "Return -> pass"), (8, "Add -> Sub"), (8, "2 -> 3"),
    ])
    by_what = {m.what: text for m, text in mutants(SOURCE, None)}
    assert "if a <= b and (not a):" in by_what["Lt -> LtE"]
    assert "a -= 1" in by_what["Add= -> Sub="]
    assert "return a - 2" in by_what["Add -> Sub"]
    assert "a += 1" not in by_what["AugAssign -> pass"]
    assert "return a + 3" in by_what["2 -> 3"]
    # each mutant changes only its own site
    assert "return a + 2" in by_what["Lt -> LtE"] and "a += 1" in by_what["2 -> 3"]


def test_lines_select_the_sites() -> None:
    assert {m.line for m, _ in mutants(SOURCE, (8, 8))} == {8}


def test_a_survivor_is_reported_and_the_file_restored(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def double(x):\n    return x * 2\n")
    test = tmp_path / "test_m.py"
    # double(0) == 0 holds for x // 2 and x * 3 too: only the dropped return is caught
    test.write_text("from m import double\n\ndef test_it():\n    assert double(0) == 0\n")
    out = subprocess.run([sys.executable, str(REPO / "tools" / "mutate.py"), str(module),
                          "--", str(test), "--rootdir", str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert "1 of 3 killed" in out, out
    survivors = out.split("survivors:")[1]
    assert "Mult -> FloorDiv" in survivors and "2 -> 3" in survivors
    assert "Return -> pass" not in survivors
    assert module.read_text() == "def double(x):\n    return x * 2\n"


def test_a_run_stopped_from_outside_puts_the_module_back(tmp_path: Path) -> None:
    """``timeout`` sends SIGTERM: the module must not stay mutated."""
    module = tmp_path / "m.py"
    original = "def double(x):\n    return x * 2\n"
    module.write_text(original)
    (tmp_path / "test_m.py").write_text(
        "import time\nfrom m import double\n\ndef test_it():\n    time.sleep(1)\n"
        "    assert double(2) == 4\n")
    proc = subprocess.Popen([sys.executable, str(REPO / "tools" / "mutate.py"), str(module),
                             "--", str(tmp_path / "test_m.py"), "--rootdir", str(tmp_path)],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("baseline passes")
    deadline = time.monotonic() + 10
    while module.read_text() == original:  # the first mutant is written
        assert time.monotonic() < deadline, "no mutant was written"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert module.read_text() == original
