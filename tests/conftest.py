"""Checks that every test leaves the machine as it found it: no shared-memory segment and no
child process left behind."""
import argparse
import glob
import multiprocessing
import os
import threading
import time
import types
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
import appo_ipc
import env as envs

# Every process this test run starts inherits it: how the leak check tells this run's processes
# from those of another run on the same machine. Each pytest-xdist worker is a run of its own.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["APPO_TEST_RUN"] = uuid.uuid4().hex
RUN_TAG = "APPO_TEST_RUN=" + os.environ.setdefault("APPO_TEST_RUN", uuid.uuid4().hex)

# The tests' own tensor work (models trained in this process) on one thread, as appo.py gives each
# of its processes on 2 cores. With torch's default of a thread per core, a test process that shares
# the cores (two tests at a time, or beside a training) waits at every parallel op for whichever of
# its threads is descheduled: beside a doom_basic training, two at a time, the critic test's 120
# small SGD steps ran over 20 minutes (13.5 s two at a time on an idle machine, at f5c9887). Only
# this process: children start from the fork server or a fresh interpreter, with their own setting
# (test_plumbing checks theirs).
torch.set_num_threads(1)


# How long a test's training command may run before the test calls it hung: the runs train a number
# of frames, not seconds, so a loaded machine makes them longer, not shorter. Beside a doom_basic
# training on the same 2 cores a 16,000-frame run of the policy-lag test took over 240 s (2026-11-28;
# about 60 s alone), and two tests at a time beside it halve each test's share of the cores again.
# Below pytest's own limit of 900 s a test (pyproject.toml), which stays the guard of a test that
# runs several commands.
RUN_TIMEOUT_S = 840


def processes_tagged(tag: str) -> list[int]:
    """Processes whose environment holds `tag`: a run started with it, its children, their envs.
    Not this test process's own multiprocessing resource tracker: a run in this process may be the
    first to spawn and so start it, but it serves the whole session and exits with it."""
    from multiprocessing import resource_tracker

    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(environ.split("/")[2]))
        except OSError:
            pass
    return [pid for pid in found if pid != resource_tracker._resource_tracker._pid]


def process_running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, all its threads) that process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def processes_still_tagged(tag: str, seconds: float = 15.0) -> list[int]:
    """processes_tagged(tag) once they had `seconds` to finish exiting (a multiprocessing resource
    tracker outlives its run by a moment)."""
    deadline = time.monotonic() + seconds
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_tagged(tag)


def vizdoom_processes() -> dict[int, str]:
    """pid -> VizDoom instance id, for each vizdoom process that this test process started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        parent_pid = int(stat.rsplit(")", 1)[1].split()[1])
        if parent_pid == os.getpid() and b"+viz_instance_id" in args:
            found[int(entry)] = args[args.index(b"+viz_instance_id") + 1].decode()
    return found


def check_bfloat16_encoder(model32, model16, obs: dict) -> None:
    """--encoder_dtype bfloat16 on any device (model16 holds model32's weights): the features come
    out float32 on the models' device, within bf16 rounding of float32's yet not equal to them
    (bfloat16 did compute), and the encoder's weights and gradients stay float32 and finite."""
    features32, features16 = model32.encode(obs), model16.encode(obs)
    assert features16.dtype == torch.float32 and features16.device == features32.device
    assert not torch.equal(features16, features32)
    assert (features16 - features32).norm() / features32.norm() < 0.02
    features16.square().sum().backward()
    for name, parameter in model16.named_parameters():
        if name.startswith(("encoders", "fc")):
            assert parameter.dtype == torch.float32 and parameter.grad.dtype == torch.float32, name
            assert torch.isfinite(parameter.grad).all(), name


def vizdoom_gone(processes: dict[int, str]) -> None:
    """Each of these vizdoom processes (pid -> instance id) has exited and left no /dev/shm entry."""
    for pid, instance_id in processes.items():
        assert not os.path.exists(f"/proc/{pid}"), f"vizdoom process {pid} still exists after close()"
        leftovers = [name for name in os.listdir("/dev/shm") if instance_id in name]
        assert not leftovers, f"/dev/shm entries left by vizdoom: {leftovers}"


def doom_player_threads() -> list:
    """The threads of a Doom match's players (env.py names them doom-player-N)."""
    return [thread for thread in threading.enumerate() if thread.name.startswith("doom-player-")]


@pytest.fixture
def make_doom(tmp_path, monkeypatch):
    """Creates Doom envs, single-player scenarios and matches alike (env.create_env with these flag
    values); afterwards closes each twice (close is idempotent) and checks that its vizdoom
    processes (one per agent), their /dev/shm entries and a match's player threads are gone."""
    monkeypatch.chdir(tmp_path)  # VizDoom leaves a _vizdoom/ folder in the working directory
    created = []  # (env, {pid: instance id})

    def make(name, render_mode=None, env_index=0, **flag_values):
        before = vizdoom_processes()
        env = envs.create_env(name, argparse.Namespace(**flag_values), env_index=env_index, render_mode=render_mode)
        started = {pid: iid for pid, iid in vizdoom_processes().items() if pid not in before}
        assert len(started) == envs.get_num_agents(env), "one vizdoom process per agent"
        created.append((env, started))
        return env

    yield make

    for env, started in created:
        env.close()
        env.close()
        vizdoom_gone(started)
    assert not doom_player_threads()


shm_entries = appo_ipc.shm_entries


def shm_left_by_this_run(before: set[str]) -> list[str]:
    """What this test run added to /dev/shm since `before`, leaving out this process's CUDA IPC
    files (they live as long as it does; the runner removes its own at exit) and what a live
    process of another run holds. The machine is shared: another appo run's segments come and go
    meanwhile. One that such a run made and then left without a process holding it cannot be told
    apart from this run's, and counts."""
    own_cuda = {os.path.basename(path) for path in appo.cuda_ipc_files([os.getpid()])}
    return appo_ipc.shm_left_since(before | own_cuda, own_pids={os.getpid(), *processes_tagged(RUN_TAG)})


def outside_a_run(cfg, spaces_pair, **fields):
    """What a Learner built alone (no runner) reads of a run's shared state: its policy's published
    weights, version 0, which it starts from (on the GPU with --device cuda, as create_shared
    makes them), and any other `fields` given (slots, run, ...)."""
    device = torch.device(cfg.device)
    weights = appo.SharedWeights(appo.ActorCritic(*spaces_pair, cfg), device if device.type == "cuda" else None)
    return types.SimpleNamespace(weights=[weights], **fields)


def free_handed_slots(cfg, shared) -> int:
    """Does what each learner does with the slots a rollout worker handed it (takes them from the
    worker that sent them, then frees them), without training; how many it freed."""
    freed = 0
    for policy, learner_queue in enumerate(shared.learner_queues):
        while learner_queue.qsize():
            slot, generation, owner = learner_queue.get(timeout=1)
            assert shared.slots.control.transfer(slot, owner, generation, appo.learner_owner(cfg, policy))
            shared.slots.control.release([slot])
            freed += 1
    return freed


def gather_slots(slots: appo.RolloutSlots, slot_indices: list[int]) -> dict[str, torch.Tensor]:
    """Copies whole trajectories out of the slots, as a test reads them (the learner copies with
    BatchBuffers): name -> [T+1, len(slot_indices), ...], time first, as views of trajectory-major
    copies (see appo.trajectory_major)."""
    index = torch.as_tensor(slot_indices, dtype=torch.long)
    return {name: tensor.index_select(0, index).transpose(0, 1) for name, tensor in slots.tensors.items()}


# A small config, the spaces of a model with two inputs and two action heads, and its observations
# and batches: the tests of appo.py's model, losses, learner and plumbing share them, and others do.

def small_cfg(**overrides):
    """doom_basic's flags with a small model (hidden size 32) and batch (24 steps, rollouts of 6),
    and any flag values in `overrides` set on it as given (after parsing, so nothing checks them)."""
    cfg = appo.parse_args(["--env", "doom_basic", "--hidden_size", "32", "--rollout", "6", "--batch_size", "24"])
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


IMAGE_AND_VECTOR = spaces.Dict({"obs": spaces.Box(0, 255, (3, 36, 64), np.uint8),
                                "measurements": spaces.Box(-1, 1, (5,), np.float32)})
TWO_HEADS = spaces.Tuple((spaces.Discrete(3), spaces.Discrete(4)))


def random_obs(obs_space, leading_shape, seed=0):
    """Observations of `obs_space` (key -> tensor of `leading_shape` + the key's shape): uniform bytes
    for pixels, standard normal floats otherwise."""
    generator = torch.Generator().manual_seed(seed)
    obs = {}
    for key, (shape, dtype) in appo.obs_shapes(obs_space).items():
        if dtype == np.uint8:
            obs[key] = torch.randint(0, 256, (*leading_shape, *shape), dtype=torch.uint8, generator=generator)
        else:
            obs[key] = torch.randn(*leading_shape, *shape, generator=generator)
    return obs


def fake_batch(obs_space, action_space, cfg, steps, batch, policy_version=0):
    """A batch [steps+1, batch, ...] as the learner trains on: random observations, actions and
    rewards, some episode ends, every step valid and acted by `policy_version`."""
    heads = appo.action_distribution(action_space).head_sizes
    data = random_obs(obs_space, (steps + 1, batch))
    data["rnn_state"] = torch.zeros(steps + 1, batch, appo.rnn_state_size(cfg))
    data["actions"] = torch.stack([torch.randint(0, n, (steps + 1, batch)) for n in heads], dim=-1)
    data["log_prob"] = torch.full((steps + 1, batch), -1.5)
    data["value"] = torch.zeros(steps + 1, batch)
    data["reward"] = torch.randn(steps + 1, batch)
    data["done"] = (torch.rand(steps + 1, batch) < 0.1).float()
    data["truncated"] = torch.zeros(steps + 1, batch)
    data["policy_version"] = torch.full((steps + 1, batch), policy_version, dtype=torch.long)
    data["valid"] = torch.ones(steps + 1, batch)
    for name, (shape, dtype) in appo.acting_fields(appo.action_distribution(action_space)).items():
        if name not in data:  # a field a forker added: zeros
            data[name] = torch.zeros((steps + 1, batch, *shape), dtype=getattr(torch, dtype.name))
    return data


def learner_with_weights(cfg) -> appo.Learner:
    """A Learner of IMAGE_AND_VECTOR and TWO_HEADS built alone (outside_a_run), with the run
    counters and hyperparameters that its train_step writes and reads."""
    run = types.SimpleNamespace(learner_frames=np.zeros(1, np.int64), learner_version=np.zeros(1, np.int64))
    shared = outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS), run=run, hyperparams=appo.PolicyHyperparams(cfg, None))
    return appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS))


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    before = shm_entries()
    yield
    leaked = shm_left_by_this_run(before)
    assert not leaked, f"left in /dev/shm: {leaked}"
    children = multiprocessing.active_children()
    assert not children, f"child processes still running: {children}"


@pytest.fixture
def processes():
    """The multiprocessing context the runner starts its children with (children fork from a
    server that imported torch), stopped afterwards as a run stops it."""
    yield appo.child_process_context()
    appo.stop_fork_server()
