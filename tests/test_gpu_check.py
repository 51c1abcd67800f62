"""scripts/gpu_check.py: how it reads a training run, and what it does on a machine with no GPU.
(Its full dry run, `run --device cpu`, takes minutes: docs/gpu.md gives the command.)"""
import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import gpu_check  # noqa: E402

OUTPUT = """training doom_basic on cuda with 16 processes in /tmp/x/trained; follow it with tensorboard
[      5s] frames 10,000 | FPS 10s/60s/300s 0/0/0 | samples/s 0
[     10s] frames 50,000 | FPS 10s/60s/300s 8,000/8,000/8,000 | samples/s 2,000 | lag 0/0.5/1 trained 40,960
[     30s] frames 250,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 204,800 | avg return -50.00 (20 ep)
[     40s] frames 350,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 307,200 | avg return 10.50 (100 ep)
[     50s] frames 450,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 409,600 | avg return 60.25 (100 ep)
[     52s] frames 460,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 411,648 | avg return 61.00 (100 ep)
"""


def test_the_check_reads_trained_frames_and_score_from_appos_status_lines():
    lines = gpu_check.status_lines(OUTPUT)
    assert [line["seconds"] for line in lines] == [5, 10, 30, 40, 50, 52]
    assert lines[0]["trained"] == 0 and lines[1]["trained"] == 40_960 and lines[1]["return"] is None
    assert lines[-1]["return"] == 61.0 and lines[-1]["episodes"] == 100
    # from the first line 20 s after training began (30 s) to the last before the stop (50 s)
    assert gpu_check.training_rate(lines) == pytest.approx((409_600 - 204_800) / 20)


def test_without_a_gpu_a_cuda_check_fails_at_the_machine_step_says_why_and_skips_the_rest(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_check.py"), "run", "--device", "cuda",
                             "--out", str(out), "--wheels", str(tmp_path / "no_wheels")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    steps = {step["step"]: step for step in json.loads((out / "summary.json").read_text())["steps"]}
    assert list(steps) == ["packages", "machine", "build", *gpu_check.STEPS]
    assert steps["packages"]["status"] == "skipped" and "no wheels" in steps["packages"]["reason"]
    assert steps["machine"]["status"] == "failed" and "torch sees no GPU" in steps["machine"]["reason"]
    for name in ["build", *gpu_check.STEPS]:
        assert steps[name]["status"] == "skipped" and "machine" in steps[name]["reason"], name
    assert "| machine | failed |" in (out / "summary.md").read_text()
    assert "torch sees no GPU" in (out / "steps.log").read_text()


def test_unknown_steps_are_refused_by_name():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["run", "--out", "x", "--steps", "train,trian"])
    assert gpu_check.parse_args(["run", "--out", "x", "--steps", "eval"]).steps == ["eval"]
