"""--seed reaches every process of a run: each child seeds its generators from the run's seed, its
role and its index (appo.seed_process), so that two policy workers draw different action noise and a
multi-process run's sampling follows --seed."""
import glob
import os
import subprocess
import sys

import pytest
import torch

import appo
from conftest import RUN_TIMEOUT_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw_action_noise(seed, index, results):
    """A child as the runner starts one (from the fork server): its setup, then one sample of a
    six-dimensional Gaussian policy at mean 0, std 1 (the noise a policy worker adds to its actions)."""
    appo.child_process_setup("policy", seed=None if seed is None else (seed, index))
    results.put((index, appo.DiagonalGaussian(6).sample(torch.zeros(1, 12)).flatten().tolist()))


def noise_of_children(processes, seeds_and_indices) -> dict:
    results = processes.Queue()
    children = [processes.Process(target=draw_action_noise, args=(seed, index, results))
                for seed, index in seeds_and_indices]
    for child in children:
        child.start()
    drawn = dict(results.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=60)
    return drawn


def test_two_children_of_one_fork_server_draw_alike_unless_seeded(processes):
    """What seed_process mends: children fork from one server that imported torch, and start from
    its generator state, so unseeded two policy workers sample the same noise."""
    unseeded = noise_of_children(processes, [(None, 1), (None, 2)])
    assert unseeded[1] == unseeded[2]
    seeded = noise_of_children(processes, [(5, 1), (5, 2)])
    assert seeded[1] != seeded[2]


def test_a_childs_stream_is_its_seed_role_and_index(processes):
    first = noise_of_children(processes, [(5, 1), (5, 2)])
    appo.stop_fork_server()  # a new server, as a second run starts one: the streams do not come from it
    again = noise_of_children(appo.child_process_context(), [(5, 1), (5, 2)])
    assert again == first
    other_seed = noise_of_children(appo.child_process_context(), [(6, 1), (6, 2)])
    assert other_seed[1] != first[1] and other_seed[2] != first[2]
    # the role takes part too: a learner and a policy worker at one index draw differently
    appo.seed_process(5, "learner", 1)
    learner_noise = torch.randn(6).tolist()
    appo.seed_process(5, "policy", 1)
    assert torch.randn(6).tolist() != learner_noise


def final_weights(train_dir, experiment: str) -> dict:
    path = sorted(glob.glob(os.path.join(train_dir, experiment, "checkpoint_p0", "checkpoint_*.pth")))[-1]
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
def test_two_multi_process_runs_with_a_seed_train_alike(tmp_path):
    """With one env (so that the policy worker serves its requests in one order whatever the timing)
    a run of separate processes is repeatable from --seed: before its children seeded themselves the
    policy worker's action noise came from the fork server's state, random at every run, and two runs
    at --seed 3 ended with different weights."""
    def train(experiment: str, seed: int):
        command = [sys.executable, os.path.join(REPO, "appo.py"), "--env", "gym:Pendulum-v1", "--num_workers", "1",
                   "--num_envs_per_worker", "1", "--worker_num_splits", "1", "--seed", str(seed),
                   "--train_for_env_steps", "6000", "--train_dir", str(tmp_path), "--experiment", experiment]
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert run.returncode == 0, run.stdout + run.stderr
        return final_weights(str(tmp_path), experiment)

    first, second, other = train("first", 3), train("second", 3), train("other", 4)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)
