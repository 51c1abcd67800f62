"""--serial_mode: the whole run in the calling process, for a debugger; with --seed, repeatable."""
import glob
import multiprocessing
import os
import subprocess
import sys
import uuid

import pytest
import torch

import appo
from conftest import processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serial_flags(train_dir, experiment: str, frames: int) -> list[str]:
    return ["--serial_mode", "--env", "doom_basic", "--num_workers", "2", "--num_envs_per_worker", "2",
            "--rollout", "16", "--batch_size", "128", "--hidden_size", "64", "--seed", "1",
            "--train_for_env_steps", str(frames), "--train_dir", str(train_dir), "--experiment", experiment]


def final_weights(train_dir, experiment: str) -> dict:
    path = sorted(glob.glob(str(train_dir / experiment / "checkpoint_p0" / "checkpoint_*.pth")))[-1]
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
def test_two_serial_runs_with_a_seed_train_alike_in_this_process(tmp_path, monkeypatch):
    losses: list[float] = []
    compute_loss = appo.appo_loss

    def recorded_loss(*args, **kwargs):
        assert multiprocessing.active_children() == []  # the learner runs here, and no worker apart
        loss, stats = compute_loss(*args, **kwargs)
        losses.append(loss.item())
        return loss, stats

    monkeypatch.setattr(appo, "appo_loss", recorded_loss)  # the learner's call resolves the name at run time
    runs = {}
    for experiment in ("first", "second"):
        losses.clear()
        assert appo.main(serial_flags(tmp_path, experiment, frames=6_000)) == 0
        runs[experiment] = list(losses)
    assert len(runs["first"]) >= 10  # 6,000 frames / (128 samples x frameskip 4) SGD steps
    assert runs["first"] == runs["second"]
    first, second = final_weights(tmp_path, "first"), final_weights(tmp_path, "second")
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
def test_a_breakpoint_in_the_loss_stops_under_pdb(tmp_path):
    """What --serial_mode is for: python -m pdb appo.py --serial_mode ... stops in appo_loss."""
    with open(os.path.join(REPO, "appo.py")) as f:
        lines = f.read().splitlines()
    in_loss = lines.index(next(text for text in lines if text.startswith("def appo_loss(")))
    line = 1 + next(number for number in range(in_loss, len(lines)) if lines[number].strip() == "action_dist = model.action_dist")
    commands = f"break {os.path.join(REPO, 'appo.py')}:{line}\ncontinue\np policy_version >= 0\nquit\n"
    tag = uuid.uuid4().hex
    result = subprocess.run([sys.executable, "-m", "pdb", os.path.join(REPO, "appo.py"),
                             *serial_flags(tmp_path, "pdb", frames=100_000)],
                            input=commands, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                            env=dict(os.environ, APPO_TEST_TAG=tag))
    assert "appo_loss()" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(Pdb) True" in result.stdout  # it evaluated an argument of the loss, in the loss's frame
    assert processes_still_tagged(tag) == []  # quitting the debugger ends the run's env processes too
