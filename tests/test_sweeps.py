"""scripts/tools/sweep_doom_basic_lr.sh: real short runs in parallel, each its own experiment, then plot.py.
The runs are --serial_mode (one process each): what is tested is the sweep, and a run's processes are
tested elsewhere; four runs starting three processes each made this one of the suite's slowest tests
beside a training."""
import os
import subprocess
import sys
import uuid

import pytest

from conftest import RUN_TIMEOUT_S, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_seed_and_learning_rate_sweep_runs_every_pair_and_plots(tmp_path):
    tag = uuid.uuid4().hex
    env = {**os.environ, "SWEEP_TEST_TAG": tag, "TRAIN_DIR": str(tmp_path), "SWEEP": "sweep",
           "SEEDS": "1 2", "LRS": "1e-4 3e-4", "MAX_PARALLEL": "2", "STEPS": "2000"}
    result = subprocess.run(["bash", os.path.join(REPO, "scripts", "tools", "sweep_doom_basic_lr.sh"), "--num_workers", "1",
                             "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--batch_size", "64",
                             "--rollout", "16", "--report_every_sec", "1", "--serial_mode"],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    names = [f"doom_basic_lr{lr}_seed{seed}" for lr in ("1e-4", "3e-4") for seed in (1, 2)]
    for name in names:
        assert f"starting {name}" in result.stdout
        with open(tmp_path / "sweep" / f"{name}.log") as log:
            text = log.read()
        assert "training doom_basic" in text, text[-2000:]
        assert os.listdir(tmp_path / "sweep" / name / "checkpoint_p0"), text[-2000:]
    assert processes_still_tagged(tag) == []
    plotted = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "tools", "plot.py"),
                              *[str(tmp_path / "sweep" / name) for name in names], "--tag", "perf/fps"],
                             capture_output=True, text=True, timeout=120)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert "doom_basic_lr1e-4 (mean of 2)" in plotted.stdout and "doom_basic_lr3e-4 (mean of 2)" in plotted.stdout
