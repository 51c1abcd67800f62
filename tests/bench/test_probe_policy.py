"""bench/probe_policy.py: what a gym: checkpoint does beyond its score (real MuJoCo, a real
short training)."""
import glob
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import probe_policy  # noqa: E402

pytest.importorskip("mujoco")


@pytest.mark.parametrize("env_id", sorted(probe_policy.POSTURE))
def test_the_posture_indices_are_the_torsos_pitch_and_forward_speed_in_the_simulator(env_id):
    """The probe reads the observation; the truth is MuJoCo's state: the root's pitch hinge
    qpos[2] and its forward velocity qvel[0], checked along random play that moves both."""
    env = gym.make(env_id)
    pitch_at, speed_at = probe_policy.POSTURE[env_id]
    obs, _ = env.reset(seed=0)
    data = env.unwrapped.data
    speeds = []
    for _ in range(50):
        obs, *_ = env.step(env.action_space.sample())
        assert obs[pitch_at] == pytest.approx(data.qpos[2]) and obs[speed_at] == pytest.approx(data.qvel[0])
        speeds.append(data.qvel[0])
    assert np.std(speeds) > 0  # a velocity that moved, not a constant that matched by chance
    env.close()


@pytest.mark.slow
def test_the_probe_plays_a_trained_checkpoint_and_reports_its_posture(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), "--env", "gym:HalfCheetah-v5",
                          "--num_workers", "1", "--train_for_env_steps", "4000", "--seed", "1",
                          "--train_dir", str(tmp_path), "--experiment", "cheetah"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    checkpoint = sorted(glob.glob(str(tmp_path / "cheetah" / "checkpoint_p0" / "*.pth")))[-1]
    probe = subprocess.run([sys.executable, os.path.join(REPO, "bench", "probe_policy.py"), checkpoint,
                            "--episodes", "1"], capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report["env"] == "gym:HalfCheetah-v5" and len(report["returns"]) == 1
    assert len(report["policy_std"]) == 6 and all(0.5 < std < 2 for std in report["policy_std"])  # near its start, 1
    assert 0 <= report["upside_down"] <= 1 and -1 <= report["mean_cos_pitch"] <= 1
    assert 0 < report["clipped_share"] < 1  # std 1 around means near 0 leaves [-1, 1] often, not always
