"""What the benchmark scripts record beside their figures: the commit, the CPU, torch's version and
the precision. bench_policy_worker.py's runs and bench_throughput.py's --json output lacked the
last three (docs/bench/policy_worker/, docs/bench/throughput/gpu_path_2026-11-27/). Each record
is built here by the function the bench calls, without timing anything."""
import json
import os
import re
import subprocess
import sys

import torch

import appo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_policy_worker  # noqa: E402
import bench_throughput  # noqa: E402


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")


def test_a_policy_worker_run_records_its_commit_cpu_torch_and_precision():
    path = list(sys.path)
    record = bench_policy_worker.record_of(REPO, appo, "cpu")
    assert sys.path == path  # a --tree's modules still come from that tree
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert record["commit"].startswith(head) and record["tree"] == REPO
    assert record["machine"] == {"cpu": cpu_model(), "cores": os.cpu_count(), "bfloat16": appo.native_bfloat16("cpu")}
    assert record["torch"] == torch.__version__
    # what --encoder_dtype auto resolves to on this CPU, as the policy worker's model computes
    assert record["precision"] == ("bfloat16 encoder" if appo.native_bfloat16("cpu") else "float32 encoder")
    assert record["device"] == "cpu" and record["clock"] == "thread CPU time"
    json.dumps(record)  # it goes into the result file as it is


def test_bench_throughputs_json_output_records_its_commit_cpu_torch_and_precision(monkeypatch, tmp_path):
    """--json's output (what gpu_check reads, and what the gpu_path files were) now carries the same
    provenance as a result file from --out, and --report shows its commit."""
    monkeypatch.setattr(sys, "argv", ["bench_throughput.py", "--env", "doom_basic", "--legs", "ours,sf"])
    args = bench_throughput.parse_args()
    flags = bench_throughput.trainer_config(args, 8)
    result = bench_throughput.configuration_result(args, 8, flags, {"ours": [{"fps": 1400.0}], "sf": [{"fps": 1100.0}]})
    printed = bench_throughput.json_output(args, [result])
    provenance = printed["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["commit"])
    assert provenance["cpu"] == cpu_model() and provenance["cores"] == os.cpu_count()
    assert provenance["torch"] == torch.__version__ and provenance["cpu_bfloat16"] == appo.native_bfloat16("cpu")
    ours = "bfloat16 encoder" if appo.native_bfloat16("cpu") else "float32 encoder"
    assert printed["precision"]["ours"] == ours and printed["precision"]["sf"] == "float32"
    assert printed["ours_fps"] == 1400.0  # the figures as before, the provenance beside them

    (tmp_path / "run.json").write_text(json.dumps(printed))
    (tmp_path / "old.json").write_text(json.dumps(result))  # a file kept from --json before it had one
    table = bench_throughput.comparison_table([str(tmp_path / "run.json"), str(tmp_path / "old.json")])
    assert f"| run.json | doom_basic | (defaults) | {provenance['commit'][:7]} |" in table
    assert "| old.json | doom_basic | (not recorded) | - |" in table

    monkeypatch.setattr(args, "envs_per_worker", [4, 8])  # a sweep: a list, each configuration with its own
    assert [r["provenance"]["commit"] for r in bench_throughput.json_output(args, [result, result])] == \
        [provenance["commit"]] * 2


def test_throughput_mds_compile_table_is_what_its_result_file_says():
    """docs/results/throughput.md's `--compile` row: each leg's median and runs, and both ratios to
    Sample Factory, as the result file it names records them (rounded as the page prints them)."""
    with open(os.path.join(REPO, "docs", "results", "throughput.md")) as f:
        page = f.read()
    section = page[page.index("## `--compile`"):page.index("## The cost of `--encoder resnet`")]
    name = re.search(r"docs/bench/throughput/compile/(doom_basic_\w+\.json)", section).group(1)
    with open(os.path.join(REPO, "docs", "bench", "throughput", "compile", name)) as f:
        result = json.load(f)["results"][0]
    row = next(line for line in section.splitlines() if line.startswith("| frames trained / s |"))

    def leg(key: str) -> str:
        runs = ", ".join(f"{run['fps']:,.0f}" for run in result["runs"][key])
        return f"{result[key + '_fps']:,.0f} ({runs})"
    expected = (f"| frames trained / s | {leg('ours')} | {leg('ours_compile')} | {leg('sf')} | "
                f"{result['ours_over_sf']:.2f} | {result['ours_compile_over_sf']:.2f} |")
    assert row == expected
    start_up = [", ".join(f"{run['first_trained_s']:.1f}" for run in result["runs"][key]) + " s"
                for key in ("ours", "ours_compile")]
    assert f"| launch to the first frames trained | {start_up[0]} | {start_up[1]} |" in section
    busy = [", ".join(f"{run['busy_percent']['learner']:.0f}%" for run in result["runs"][key])
            for key in ("ours", "ours_compile")]
    assert f"| learner busy (each run's status line) | {busy[0]} | {busy[1]} |" in section
    assert result["precision"]["ours"] == result["precision"]["ours_compile"] == "float32 encoder"  # like for like
    gain = result["ours_compile_fps"] / result["ours_fps"]
    assert f"`--compile` over appo.py: {gain:.2f} at the medians" in section


def suite_log_says(path: str) -> dict:
    """What a saved run of the test suite says of itself: its header's commit, machine and mode, and
    pytest's summary line (a stopped run has none: its result lines are counted instead)."""
    with open(path) as f:
        text = f.read()
    command, machine_line = text.splitlines()[:2]
    said = {"commit": re.search(r"(?:worktree|checkout) of ([0-9a-f]{7})", command).group(1),
            "machine": "AMD EPYC" if "AMD EPYC" in machine_line else
                       "Intel Xeon @ 2.50GHz" if "Intel(R) Xeon(R) Processor @ 2.50GHz" in machine_line else "?",
            "how": ("two at a time" if "-n 2" in command else "one at a time")
                   + (", beside a training" if "beside `python appo.py --env doom_basic`" in command else ", alone")}
    summary = re.findall(r"^(.*(?:passed|failed).*) in ([0-9.]+)s", text, re.M)
    if summary:
        counts, seconds = summary[-1]
        count = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", counts)}
        failed = str(count.get("failed", 0)) + (f" (+{count['error']} error)" if count.get("error") else "")
        said.update(passed=str(count["passed"]), failed=failed, skipped=str(count["skipped"]),
                    s=str(round(float(seconds))))
    else:
        stopped = re.search(r"stopped by hand at (\d+%)", text).group(1)
        errors = len(re.findall(r" ERROR\b", text))
        said.update(passed=f"stopped at {stopped}: {len(re.findall(r' PASSED', text))}",
                    failed=f"{len(re.findall(r' FAILED', text))} (+{errors} errors)", skipped="-", s="-")
    return said


def test_every_saved_run_of_the_suite_is_in_testing_mds_table_as_its_log_says():
    """docs/testing.md's table of the suite's runs: one row for each log in docs/bench/suite/, its
    commit, machine, mode, counts and seconds as the log's own header and pytest's summary say."""
    with open(os.path.join(REPO, "docs", "testing.md")) as f:
        rows = [line.split("|")[1:-1] for line in f if line.startswith("| `")]
    columns = ["commit", "machine", "how", "passed", "failed", "skipped", "s"]
    table = {row[0].strip().strip("`"): dict(zip(columns, (cell.strip() for cell in row[1:]))) for row in rows}
    logs = sorted(os.listdir(os.path.join(REPO, "docs", "bench", "suite")))
    assert sorted(table) == logs
    for name in logs:
        assert table[name] == suite_log_says(os.path.join(REPO, "docs", "bench", "suite", name)), name


def test_throughput_mds_feed_forward_learner_table_is_what_its_result_file_says():
    """docs/results/throughput.md's learner steps before and after a12023f: each cell the median of
    the three alternating rounds its result file records, and the ratio of the two."""
    with open(os.path.join(REPO, "docs", "results", "throughput.md")) as f:
        page = f.read()
    section = page[page.index("## A feed-forward policy's learner step"):page.index("## The IPC queue")]
    with open(os.path.join(REPO, "docs", "bench", "throughput", "feedforward_core_2026-12-05.txt")) as f:
        blocks = f.read().split("\n\n")
    rows = [line for line in section.splitlines() if line.startswith("| ") and " ms |" in line]
    # the file's blocks in its order: 10 epochs, the family's 2 epochs, atari_pong; the table's rows:
    # 2 epochs, 10 epochs, atari_pong
    assert len(blocks) == len(rows) == 3
    for block, row in zip((blocks[1], blocks[0], blocks[2]), rows):
        medians = []
        for side in ("before", "after"):
            runs = [float(ms) for ms in re.findall(rf"^{side}: .*wall_ms_per_step: ([0-9.]+)", block, re.M)]
            assert len(runs) == 3, block
            medians.append(sorted(runs)[1])
        cells = row.strip("| ").split(" | ")
        assert cells[1:] == [f"{medians[0]:,.1f} ms", f"{medians[1]:,.1f} ms", f"{medians[1] / medians[0]:.2f}"], row
