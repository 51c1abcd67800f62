"""torchrun: two ranks on this machine (gloo), each a whole trainer on real VizDoom, learners
averaging gradients. The weights must end bit-identical and a killed rank must end the job."""
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

import appo
from conftest import processes_still_tagged, processes_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--env", "doom_basic", "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "1",
         "--batch_size", "64", "--rollout", "16", "--learner_threads", "1", "--report_every_sec", "2"]


def torchrun(tmp_path, tag: str, *flags: str, script: str = os.path.join(REPO, "appo.py"),
             run: list[str] = SMALL) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--log_dir", str(tmp_path / "torchrun_logs"),  # else torchrun leaves a torchelastic_* folder in /tmp
               script, *run, "--train_dir", str(tmp_path), "--experiment", "ddp", *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "DISTRIBUTED_TEST_TAG": tag,  # a launcher in tests/ imports this checkout's appo
                                 "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])},
                            start_new_session=True)


@pytest.mark.slow
def test_two_ranks_train_in_lockstep_with_identical_weights_and_summed_frames(tmp_path):
    tag = uuid.uuid4().hex
    job = torchrun(tmp_path, tag, "--train_for_env_steps", "6000")
    output, _ = job.communicate(timeout=400)
    assert job.returncode == 0, output[-4000:]
    finals = {rank: (version, checksum) for rank, version, checksum in
              re.findall(r"rank (\d): policy version (\d+), weights checksum (\w+)", output)}
    assert set(finals) == {"0", "1"}, output[-4000:]
    assert finals["0"] == finals["1"]  # same number of steps, bit-identical weights and statistics
    assert int(finals["0"][0]) >= 6000 // (64 * 4 * 2)
    collected = {rank: int(n.replace(",", "")) for rank, n in re.findall(r"rank (\d) collected ([\d,]+) env frames", output)}
    assert set(collected) == {"0", "1"} and min(collected.values()) > 0
    reported = [int(n.replace(",", "")) for n in re.findall(r"\] frames ([\d,]+) \|", output)]
    assert reported and reported[-1] > 1.2 * max(collected.values())  # rank 0 reports both ranks' frames
    checkpoints = os.listdir(tmp_path / "ddp" / "checkpoint_p0")
    assert checkpoints
    saved = torch.load(tmp_path / "ddp" / "checkpoint_p0" / sorted(checkpoints)[-1], weights_only=True)
    model = appo.ActorCritic(*appo.probe_env(appo.parse_args(SMALL)).spaces, appo.parse_args(SMALL))
    model.load_state_dict(saved["model"])
    assert appo.weights_checksum(model) == finals["0"][1]  # rank 0 saved the weights every rank has
    assert processes_still_tagged(tag) == []


@pytest.mark.slow
def test_killing_one_rank_stops_the_whole_job_cleanly(tmp_path):
    tag = uuid.uuid4().hex
    job = torchrun(tmp_path, tag, "--train_for_seconds", "300")
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # wait until the ranks train together
        line = job.stdout.readline()
        lines.append(line)
        if re.search(r"lag \d+/", line):
            break
    assert any(re.search(r"lag \d+/", line) for line in lines), "".join(lines)[-4000:]
    rank_one = [pid for pid in processes_tagged(tag) if is_rank_main(pid, "1")]
    assert len(rank_one) == 1
    os.kill(rank_one[0], signal.SIGKILL)
    output, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert processes_still_tagged(tag, seconds=30) == [], "".join(lines) + output


def is_rank_main(pid: int, rank: str) -> bool:
    """The rank's own appo.py process (the one torchrun started), not one of its children."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return f"RANK={rank}".encode() in environ and b"appo.py" in cmdline


@pytest.mark.slow
def test_state_a_forks_model_keeps_in_a_buffer_is_rank_0s_on_every_rank(tmp_path):
    """A buffer that is no running statistic (tests/state_launcher.py: set by the loss from each rank's
    own batch) follows rank 0 after every step, so the ranks' weights and buffers end bit-identical;
    before, only the normalisers were merged, and this buffer differed by rank."""
    tag = uuid.uuid4().hex
    cartpole = ["--env", "gym:CartPole-v1", "--num_workers", "1", "--learner_threads", "1", "--report_every_sec", "2"]
    job = torchrun(tmp_path, tag, "--train_for_env_steps", "8192", script=os.path.join(REPO, "tests", "state_launcher.py"),
                   run=cartpole)
    output, _ = job.communicate(timeout=400)
    assert job.returncode == 0, output[-4000:]
    finals = {rank: (version, checksum) for rank, version, checksum in
              re.findall(r"rank (\d): policy version (\d+), weights checksum (\w+)", output)}
    assert set(finals) == {"0", "1"} and int(finals["0"][0]) >= 2, output[-4000:]
    assert finals["0"] == finals["1"]
    saved = torch.load(sorted((tmp_path / "ddp" / "checkpoint_p0").glob("*.pth"))[-1], weights_only=True)
    assert float(saved["model"]["batch_obs_mean"]) != 0  # the loss set it
    assert processes_still_tagged(tag) == []
