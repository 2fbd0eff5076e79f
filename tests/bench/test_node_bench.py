"""The node benchmarks (docs/benchmarks.md): the cost model, the GIL measurement, the feed
test's figures and search, and the device script at its CPU size (slow tier).

The model and the figures are checked against values computed by hand; the GIL measurement
against real processes whose GIL use is known (a pure-Python spin holds it whenever it runs,
a sleeping process never); ``bash bench/device/run.sh --cpu`` end to end (the TorchTitan CPU
trainer twice, 2 trials of rank worker processes, 7 scaling children, 3 feed trials of 8
ranks: 4.3 minutes at a load average of 8-10 on 2 cores before the worker trials).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import paths

ROOT = paths.REPO


def _bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


scaling = _bench("scaling")
feed = _bench("feed")
workers = _bench("workers")


def test_amdahl_from_cpu_and_gil_seconds_per_million_tokens() -> None:
    # C = 2 s/Mtok of CPU, G = 0.5 s/Mtok of it holding the GIL
    assert scaling.amdahl(2.0, 0.5, 1) == pytest.approx(500_000)  # 1e6 / 2
    assert scaling.amdahl(2.0, 0.5, 2) == pytest.approx(800_000)  # 1e6 / (0.5 + 1.5 / 2)
    assert scaling.amdahl(2.0, 0.5, 1e9) == pytest.approx(2_000_000, rel=1e-6)  # 1e6 / G
    # 2 processes, each its own GIL, on 2 cores: 2e6 / (0.5 + 1.5 * 2 / 2)
    assert scaling.amdahl(2.0, 0.5, 2, procs=2) == pytest.approx(1_000_000)
    # 4 processes on 16 cores: 4e6 / (0.5 + 1.5 / 4)
    assert scaling.amdahl(2.0, 0.5, 16, procs=4) == pytest.approx(4e6 / 0.875)
    # a GIL share measured above the CPU (a loaded machine) is all serial, never negative
    assert scaling.amdahl(1.0, 2.0, 64) == pytest.approx(1_000_000)


def test_the_model_predicts_each_configuration_from_the_first() -> None:
    def rec(tokens: float, wall: float, cpu: float, **kw: Any) -> dict[str, Any]:
        return {"tokens": tokens, "wall": wall, "cpu": cpu, "server_cpu": cpu * 0.9,
                "load1": 0.5, **kw}

    runs = {
        # 1 core: 1e6 tokens in 2 s on 2 CPU-seconds -> 500k tokens/s, C = 2 s/Mtok
        "text|sidecar|1|1": [rec(1e6, 2.0, 2.0), rec(1e6, 2.5, 2.0), rec(1e6, 1.5, 2.0)],
        # the GIL held 25% of the profiled window's 2 s for 1e6 tokens: G = 0.5 s/Mtok
        "text|sidecar|1|profile": [rec(1e6, 2.0, 2.0, gil_share=0.25,
                                       python_thread_cpu=0.6)],
        "text|sidecar|2|1": [rec(1.5e6, 2.0, 3.0)],  # 750k tokens/s
        "text|sidecar|2|2": [rec(1.9e6, 2.0, 3.8, rate_sum=950_000.0)],
    }
    m = scaling.model(runs, 1)["text|sidecar"]
    assert m["cpu_s_per_Mtok"] == pytest.approx(2.0)
    assert m["server_cpu_s_per_Mtok"] == pytest.approx(1.8)
    assert m["gil_s_per_Mtok"] == pytest.approx(0.5)
    assert m["python_thread_cpu_s_per_Mtok"] == pytest.approx(0.6)
    assert m["rate_1"] == pytest.approx(500_000)  # the median of 400k, 500k, 667k
    rows = {(r["cores"], r["procs"]): r for r in m["rows"]}
    assert rows[1, 1]["predicted"] == pytest.approx(500_000)
    assert rows[2, 1]["predicted"] == pytest.approx(800_000)  # 500k x 800k / 500k
    assert rows[2, 1]["error"] == pytest.approx(750 / 800 - 1)
    assert rows[2, 2]["predicted"] == pytest.approx(1_000_000)
    assert rows[2, 2]["measured"] == pytest.approx(950_000)
    # the node projection uses the sidecar's own CPU (1.8): 1e6 / (0.5 + 1.3 / 16)
    assert m["projection"][16] == pytest.approx(1e6 / (0.5 + 1.3 / 16))
    assert m["serial_fraction"] == pytest.approx(0.5 / 1.8)
    assert "| text | sidecar | 2.000 (1.800) | 0.500 | 27.8% | 0.600 |" in scaling.table(
        {"text|sidecar": m})


def test_rank_workers_are_one_process_per_rank_up_to_the_cores() -> None:
    # C = 2 s/Mtok, G = 0.5: on 16 cores, 8 processes of 2 cores each: 8e6 / (0.5 + 1.5 / 2)
    assert scaling.rank_workers(2.0, 0.5, 16) == pytest.approx(8e6 / 1.25)
    # fewer cores than ranks: one process per core, each on its own core (1e6 / C each)
    assert scaling.rank_workers(2.0, 0.5, 4) == pytest.approx(4 * 500_000)
    assert scaling.rank_workers(2.0, 0.5, 1) == pytest.approx(500_000)
    # 2 ranks on 16 cores: 2 processes of 8 cores, 2e6 / (0.5 + 1.5 / 8)
    assert scaling.rank_workers(2.0, 0.5, 16, ranks=2) == pytest.approx(2e6 / 0.6875)


def test_a_client_apart_predicts_the_sidecar_from_its_own_cpu() -> None:
    def rec(tokens: float, wall: float, cpu: float, server: float, **kw: Any) -> dict[str, Any]:
        return {"tokens": tokens, "wall": wall, "cpu": cpu, "server_cpu": server, "load1": 0.5,
                **kw}

    runs = {
        # the sidecar alone 1.5 CPU s/Mtok (its client 0.5 more, on a CPU of its own)
        "text|sidecar|1|1": [rec(1e6, 1.5, 2.0, 1.5)],
        "text|sidecar|1|profile": [rec(1e6, 1.5, 2.0, 1.5, gil_share=0.2,
                                       python_thread_cpu=0.4)],  # G = 0.3 s/Mtok
        "text|sidecar|2|1": [rec(1.2e6, 1.0, 2.4, 1.8)],
    }
    apart = scaling.model(runs, 1, client_apart=True)["text|sidecar"]
    shared = scaling.model(runs, 1)["text|sidecar"]
    assert apart["gil_s_per_Mtok"] == pytest.approx(0.3)
    # 2 cores: 1e6 / (0.3 + 1.2 / 2) = 1.111M against 1e6 / 1.5 = 667k at 1 core -> x 1.667
    rate1 = 1e6 / 1.5
    (two,) = [r for r in apart["rows"] if r["cores"] == 2]
    assert two["predicted"] == pytest.approx(rate1 * (1e6 / 0.9) / (1e6 / 1.5))
    # with the client sharing the cores, its CPU is counted: C = 2.0 -> 1e6 / (0.3 + 0.85)
    (two_shared,) = [r for r in shared["rows"] if r["cores"] == 2]
    assert two_shared["predicted"] == pytest.approx(rate1 * (1e6 / 1.15) / (1e6 / 2.0))
    assert apart["client_apart"] and not shared["client_apart"]
    # both project the sidecar's own CPU; the rank workers: 8 processes of 2 cores on 16
    assert apart["projection"][16] == pytest.approx(1e6 / (0.3 + 1.2 / 16))
    assert apart["projection_workers"][16] == pytest.approx(8e6 / (0.3 + 1.2 / 2))
    assert apart["projection_workers"][4] == pytest.approx(4e6 / 1.5)
    text = scaling.projection_table({"text|sidecar": apart})
    # the target's column: 16 cores against 16 x 1 core, (8e6 / 0.9) / (16e6 / 1.5)
    assert f"| {8e6 / 0.9 / (16e6 / 1.5):.2f} |" in text
    assert "| text | sidecar | 8 rank workers | 0.67 | 1.33 | 2.67 | 5.33 | 8.89 |" in text
    assert "| text | sidecar (client apart) | 2.000 (1.500) | 0.300 | 20.0% |" in scaling.table(
        {"text|sidecar": apart})


def test_a_sidecar_with_map_processes_is_modelled_as_the_sidecar() -> None:
    """``sidecar-mp``: C is the sidecar with its map processes, G its server process's; the
    client apart, the rows and projections come from the sidecar's own CPU, as without."""
    def rec(server: float, **kw: Any) -> dict[str, Any]:
        return {"tokens": 1e6, "wall": 1.0, "cpu": server + 0.5, "server_cpu": server,
                "load1": 0.5, **kw}

    runs = {"chat|sidecar-mp|1|1": [rec(1.0)],
            "chat|sidecar-mp|1|profile": [rec(1.0, gil_share=0.02, python_thread_cpu=0.1)],
            "chat|inprocess-mp|1|1": [rec(1.0)],
            "chat|inprocess-mp|1|profile": [rec(1.0, gil_share=0.02, python_thread_cpu=0.1)]}
    got = scaling.model(runs, 1, client_apart=True)
    side, inproc = got["chat|sidecar-mp"], got["chat|inprocess-mp"]
    assert side["client_apart"] and not inproc["client_apart"]
    # G = 0.02 s/Mtok of C = 1.0 (the sidecar) or 1.5 (in process: the one process is all)
    assert side["projection"][16] == pytest.approx(1e6 / (0.02 + 0.98 / 16))
    assert inproc["projection"][16] == pytest.approx(1e6 / (0.02 + 1.48 / 16))
    assert "| chat | sidecar-mp (client apart) | 1.500 (1.000) | 0.020 | 2.0% |" in \
        scaling.table({"chat|sidecar-mp": side})


def test_the_cpu_of_a_process_tree_counts_its_children() -> None:
    me = os.getpid()
    before = scaling.tree_cpu(me)
    spin = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.6: pass"])
    try:
        time.sleep(0.3)
        during = scaling.tree_cpu(me)
        assert spin.pid in during and me in during
    finally:
        spin.wait(60)
    # the child's CPU is in the tree's while it lives (0.3 s of wall, up to 0.6 s of spin)
    assert scaling.cpu_since(before, during) >= during[spin.pid] > 0.05
    assert scaling.tree_cpu(spin.pid + 10**7) == {}  # no such process: nothing


def test_saved_runs_are_replotted_merged(tmp_path: Path, capsys: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def saved(started: str, wall: float, client_cpus: str = "") -> Path:
        # the sidecar alone 1.5 CPU s/Mtok, G = 0.3 s/Mtok; 1e6 tokens in ``wall`` seconds
        path = tmp_path / f"{started}.json"
        rec = {"tokens": 1e6, "wall": wall, "cpu": 2.0, "server_cpu": 1.5, "load1": 0.5}
        path.write_text(json.dumps({"started": started, "args": {
            "cores": "1", "client_cpus": client_cpus}, "runs": {
            "text|sidecar|1|1": [rec],
            "text|sidecar|1|profile": [{**rec, "gil_share": 0.3 / wall,
                                        "python_thread_cpu": 0.4}]}}))
        return path

    old = saved("a", 2.0)
    m, started = scaling.load_model(old)
    assert started == "a" and not m["text|sidecar"]["client_apart"]
    assert m["text|sidecar"]["gil_s_per_Mtok"] == pytest.approx(0.3)
    # the projections from C and G, keyed by cores: the sidecar's own CPU (1.5)
    assert m["text|sidecar"]["projection"][16] == pytest.approx(1e6 / (0.3 + 1.2 / 16))
    assert m["text|sidecar"]["projection_workers"][16] == pytest.approx(8e6 / (0.3 + 1.2 / 2))
    new = saved("b", 1.0, client_cpus="1")  # the later run: 1M tokens/s at 1 core
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--replot", str(old), str(new), "--out",
                                      str(tmp_path / "out")])
    scaling.main()
    out = capsys.readouterr().out
    assert "| text | sidecar (client apart) | 2.000 (1.500) |" in out  # the later run wins
    assert "| 1 proc, 1 core | 1,000,000 | 1,000,000 |" in out
    assert (tmp_path / "out" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_configuration_warms_up_past_the_read_ahead_fill() -> None:
    import argparse

    args = argparse.Namespace(warmup=8.0, fill_seconds=30.0)
    assert scaling.warm_up(args, 1) == 30.0  # the fill on one core
    assert scaling.warm_up(args, 2) == 15.0
    assert scaling.warm_up(args, 14) == 8.0  # never below --warmup
    assert scaling.warm_up(args, 2, procs=2) == 30.0  # each process on one core


def test_the_model_counts_the_cores_the_machine_gives() -> None:
    def rec(tokens: float, wall: float, cpu: float, **kw: Any) -> dict[str, Any]:
        return {"tokens": tokens, "wall": wall, "cpu": cpu, "server_cpu": cpu, "load1": 0.5,
                **kw}

    runs = {
        "machine|2": [{"efficiency": 0.8}, {"efficiency": 0.7}, {"efficiency": 0.9}],
        "text|inprocess|1|1": [rec(1e6, 2.0, 2.0)],  # C = 2, 500k tokens/s
        "text|inprocess|1|profile": [rec(1e6, 2.0, 2.0, gil_share=0.25,
                                         python_thread_cpu=0.6)],  # G = 0.5
        "text|inprocess|2|1": [rec(1.4e6, 2.0, 2.8)],
        "text|inprocess|2|2": [rec(1.6e6, 2.0, 3.2, rate_sum=800_000.0)],
    }
    m = scaling.model(runs, 1)
    assert list(m) == ["text|inprocess"]  # the machine's records are no path
    rows = {(r["cores"], r["procs"]): r for r in m["text|inprocess"]["rows"]}
    # 2 CPUs give 0.8 x 2 = 1.6 cores (the median): 1e6 / (0.5 + 1.5 / 1.6)
    assert rows[2, 1]["effective_cores"] == pytest.approx(1.6)
    assert rows[2, 1]["predicted"] == pytest.approx(1e6 / (0.5 + 1.5 / 1.6))
    assert rows[2, 2]["predicted"] == pytest.approx(2e6 / (0.5 + 1.5 * 2 / 1.6))
    assert rows[1, 1]["effective_cores"] == 1.0
    assert "| 1 proc, 2 cores (1.60 effective) |" in scaling.table(m)
    # a CPU gives no more than one alone: an efficiency measured above 1 is noise
    noisy = scaling.model({**runs, "machine|2": [{"efficiency": 1.3}]}, 1)
    assert noisy["text|inprocess"]["rows"][1]["effective_cores"] == 2.0


def test_the_machine_efficiency_of_one_cpu_is_about_one() -> None:
    cpu = sorted(os.sched_getaffinity(0))[:1]
    rec = scaling.machine_efficiency(cpu, 0.3)
    assert rec["cpus"] == 1 and rec["one"] > 0 and rec["together"] > 0
    assert rec["effective"] == pytest.approx(rec["efficiency"])
    # the same loop twice on one CPU: about 1 on a quiet machine, never above 1 once clamped
    # (a loaded CI machine may starve either run, so no lower bound but a positive one)
    assert len(rec["ratios"]) == 3 and 0 < rec["efficiency"] <= 1.0
    assert rec["efficiency"] == min(1.0, rec["measured"])


def test_client_cpus_are_checked_against_the_machine() -> None:
    assert scaling.client_cpus("", [0, 1]) == []
    assert scaling.client_cpus("3,2", [0, 1, 2, 3]) == [2, 3]
    with pytest.raises(SystemExit, match="not among this process's CPUs"):
        scaling.client_cpus("5", [0, 1])
    with pytest.raises(SystemExit, match="leaves none"):
        scaling.client_cpus("0,1", [0, 1])
    with pytest.raises(SystemExit, match="not a comma list"):
        scaling.client_cpus("0-3", [0, 1, 2, 3, 4])


def test_py_spy_raw_output_is_counted_per_thread() -> None:
    raw = ("thread (4242): MainThread;<module> (a.py:3);spin (a.py:9) 120\n"
           "thread (4242): MainThread;<module> (a.py:3);other (a.py:12) 5\n"
           "thread (0x1f00): datalane-hash;run (b.py:1) 7\n"
           "process 1:\"python x.py\";<module> (x.py:1) 3\n"
           "garbage line\n")
    assert scaling.parse_raw(raw) == {4242: 125, 0x1F00: 7, -1: 3}


def _spy(code: str, tmp_path: Path) -> dict[str, Any]:
    """py-spy's GIL share of a real Python process running ``code``, with the CPU share of its
    main thread over the same window."""
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        main = proc.pid  # the main thread's id is the process id
        probe = scaling.GilProbe(proc.pid, 2.0, 100, tmp_path)
        t0 = time.perf_counter()
        while probe.running():
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        ran = scaling.thread_sched(proc.pid)[main][0] - probe.threads0[main][0]
        return {**probe.result(), "cpu_share": ran / wall}
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(scaling.pyspy_binary() is None, reason="py-spy is not installed")
def test_the_gil_share_of_a_spinning_and_of_a_sleeping_process(tmp_path: Path) -> None:
    spin = _spy("while True: pass", tmp_path)
    # it holds the GIL whenever it runs: the share weighted by its on-CPU time is its CPU
    # share (1.0 on an idle core, less when others share the core), within the sampling error
    assert spin["gil_share"] == pytest.approx(spin["cpu_share"], rel=0.2, abs=0.05)
    assert spin["gil_share_uncorrected"] >= spin["gil_share"] - 0.05
    assert spin["python_tids"] == [spin["python_tids"][0]] and spin["gil_samples"] > 50
    sleep = _spy("import time\nwhile True: time.sleep(1)", tmp_path)
    assert sleep["gil_share"] < 0.02 and sleep["gil_samples"] <= 4


def test_the_workers_table_compares_medians_with_the_first_value() -> None:
    trials = {1: [{"achieved_per_rank": r, "sidecar_cores": 1.0} for r in (100.0, 300.0, 200.0)],
              2: [{"achieved_per_rank": r, "sidecar_cores": c} for r, c in ((380.0, 1.9),
                                                                           (340.0, 1.7))]}
    text, ratio = workers.table([1, 2], trials, "map")
    assert ratio == pytest.approx(360.0 / 200.0)  # medians: 200 and (340 + 380) / 2
    lines = text.splitlines()
    assert lines[0].startswith("| --map-processes | delivered per rank")
    assert lines[2] == "| 1 | 200 | 100 / 300 / 200 | 1.00-1.00 | 1.00x |"
    assert lines[3] == "| 2 | 360 | 380 / 340 | 1.70-1.90 | 1.80x |"


def test_feed_figures_from_the_waits_of_each_rank() -> None:
    ranks = [{"waits": [0.0005, 0.003, 0.15], "compute": 0.1, "tokens": 12_288, "wall": 0.4},
             {"waits": [0.001], "compute": 0.1, "tokens": 4096, "wall": 0.1}]
    got = feed.summarize(ranks, ready=0.002)
    assert got["steps"] == 4
    assert got["waited"] == 0.5  # 3 ms and 150 ms are over 2 ms
    assert got["stalled"] == 0.25  # 150 ms is over the 100 ms step
    assert got["idle_share"] == pytest.approx(0.05 / 0.5)  # 50 ms of the 0.5 s of steps
    assert got["p50_ms"] == pytest.approx(3.0)  # sorted [0.5, 1, 3, 150] ms, index 2
    assert got["p99_ms"] == pytest.approx(150.0)
    assert got["achieved_per_rank"] == pytest.approx((12_288 / 0.4 + 4096 / 0.1) / 2)


def test_feed_search_brackets_then_bisects_the_highest_rate_that_holds() -> None:
    tried: list[float] = []

    def run(rate: float) -> dict[str, Any]:  # the sidecar keeps up to 100k tokens/s a rank
        tried.append(rate)
        return {"rate": rate, "waited": 0.0 if rate <= 100_000 else 0.2,
                "achieved_per_rank": rate}

    best, trials = feed.search(run, 60_000, 0.25, 7)
    # 60k holds, 120k waits, then sqrt(60k x 120k) = 84,853 holds, sqrt(84,853 x 120k) =
    # 100,907 waits: 100,907 / 84,853 = 1.19 <= 1.25, done
    assert tried == pytest.approx([60_000, 120_000, 84_852.8, 100_906.8], rel=1e-5)
    assert best == pytest.approx(84_852.8, rel=1e-5)
    assert len(trials) == 4

    tried.clear()
    best, _ = feed.search(run, 400_000, 0.25, 3)  # too fast: halving, out of trials
    assert tried == [400_000, 200_000, 100_000] and best == 100_000
    tried.clear()
    best, _ = feed.search(lambda r: {"rate": r, "waited": 1.0, "achieved_per_rank": r},
                          1000, 0.25, 2)
    assert best is None


def test_feed_a_rate_the_ranks_fall_behind_does_not_hold() -> None:
    """Ranks short of CPU (pinned to few cores) fall behind their rate without any step
    waiting: such a trial must not count as sustained."""
    def run(rate: float) -> dict[str, Any]:  # no step ever waits; the ranks reach 90k at most
        return {"rate": rate, "waited": 0.0, "achieved_per_rank": min(rate, 90_000.0)}

    assert feed.held(run(88_200))  # 98% of the rate
    assert not feed.held(run(92_000))  # 97.8%
    assert not feed.held({"rate": 1000.0, "waited": 0.01, "achieved_per_rank": 1000.0})
    best, trials = feed.search(run, 60_000, 0.05, 12)
    assert best is not None and 90_000 / 1.05 <= best <= 90_000 / 0.98
    assert all(t["rate"] <= 90_000 / 0.98 for t in trials if feed.held(t))


@pytest.mark.slow
def test_the_device_script_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sidecar"),
                                          str(ROOT / "operator")])}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "device" / "run.sh"), "--cpu"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + log[-6000:]
    summary = (out / "summary.md").read_text()
    for name in ("titan", "workers", "scaling", "feed"):
        assert f"- {name}: exit 0," in summary, summary
    workers = json.loads((out / "workers.json").read_text())
    assert workers["processes"] == [1, 2]
    one, two = (workers["trials"][str(n)][0]["achieved_per_rank"] for n in (1, 2))
    assert one > 0 and workers["ratio"] == pytest.approx(two / one)
    assert "--rank-processes 2 against 1:" in (out / "workers.md").read_text()
    titan = (out / "titan.md").read_text()
    assert "MATCH: every step of every run (cpu; resumed at step 3)" in titan, titan
    result = json.loads((out / "scaling.json").read_text())
    assert sorted(result["model"]) == ["megatron|inprocess", "megatron|sidecar-mp"]
    for mode in ("inprocess", "sidecar-mp"):
        m = result["model"][f"megatron|{mode}"]
        assert m["cpu_s_per_Mtok"] > 0 and m["rate_1"] > 0
        configs = {(r["cores"], r["procs"]) for r in m["rows"]}
        assert configs == ({(1, 1), (2, 1), (2, 2)} if mode == "inprocess" else {(1, 1), (2, 1)})
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fed = json.loads((out / "feed.json").read_text())
    assert fed["ranks"] == 8
    for name in ("text", "chat", "pretokenized"):
        (t,) = fed["results"][name]["trials"]
        assert t["steps"] >= 8 and t["p50_ms"] >= 0
