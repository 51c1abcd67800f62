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
