"""The GPU path (--device cuda) on a real GPU: weights shared through CUDA IPC, pinned non-blocking
learner batches, bfloat16 autocast, checkpoints moving between GPU and CPU.

Every test here needs a CUDA GPU and is skipped, with the reason, where torch sees none (CI and
the development machines have none). bench/gpu_check.py runs this file on a GPU machine; its
dry run (--device cpu) sets APPO_CUDA_TESTS_ON_CPU=1, which runs the same tests with the CPU in
the GPU's place: that checks the tests' own logic, not CUDA.
"""
import os
import queue
import time
import types
import warnings

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
from conftest import check_bfloat16_encoder, gather_slots, outside_a_run

ON_CPU = os.environ.get("APPO_CUDA_TESTS_ON_CPU") == "1" and not torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or ON_CPU),
                                reason="needs a CUDA GPU (torch sees none): bench/gpu_check.py runs it on one")

CUDA = torch.device("cpu" if ON_CPU else "cuda")  # the GPU, or the CPU standing in for it in a dry run


def synchronize():
    if CUDA.type == "cuda":
        torch.cuda.synchronize()
IMAGE_AND_VECTOR = spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8),
                                "measurements": spaces.Box(-1, 1, (5,), np.float32)})
TWO_HEADS = spaces.Tuple((spaces.Discrete(3), spaces.Discrete(4)))


def gpu_cfg(tmp_path=None, **overrides):
    cfg = appo.parse_args(["--env", "doom_basic", "--device", CUDA.type, "--hidden_size", "64", "--rollout", "8",
                           "--batch_size", "64", "--encoder_dtype", "float32"])
    if tmp_path is not None:
        cfg.train_dir = str(tmp_path)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def random_obs(count: int, seed: int, device=CUDA) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"obs": torch.randint(0, 256, (count, 3, 72, 128), dtype=torch.uint8, generator=generator).to(device),
            "measurements": torch.randn(count, 5, generator=generator).to(device)}


def forward(model: appo.ActorCritic, obs, rnn_state) -> dict[str, np.ndarray]:
    """Numpy arrays: a child's torch tensors would travel as file descriptors that die with it."""
    with torch.inference_mode():
        logits, values, next_state = model(obs, rnn_state)
    return {"logits": logits.cpu().numpy(), "values": values.cpu().numpy(), "next_state": next_state.cpu().numpy(),
            "actions": model.action_dist.mode(logits).cpu().numpy()}


# ---------------------------------------------------------------------------------------------
# Published weights: runner allocates, learner writes, policy worker reads, each a process
# ---------------------------------------------------------------------------------------------

def learner_publishes(weights, cfg, results):
    """As Learner.train_step does: train, then publish; reports its own forward pass."""
    torch.manual_seed(11)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    for _ in range(3):  # weights that no fresh model has
        logits, values, _ = model(random_obs(16, seed=1), torch.zeros(16, appo.rnn_state_size(cfg), device=CUDA))
        (logits.square().mean() + values.square().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    weights.publish(model.eval(), version=5)
    results.put(forward(model, random_obs(32, seed=2), torch.full((32, appo.rnn_state_size(cfg)), 0.1, device=CUDA)))


def policy_worker_loads(weights, cfg, results):
    """As PolicyWorker does: its own model, in the compute dtype, loading the published weights."""
    model = appo.encoder_in_compute_dtype(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA).eval())
    version = weights.load_into(model)
    results.put({"version": version, "on_gpu": weights.flat.device.type == CUDA.type, "host_bytes": weights.buffer.size,
                 **forward(model, random_obs(32, seed=2), torch.full((32, appo.rnn_state_size(cfg)), 0.1, device=CUDA))})


def result_of(child, results, timeout: float = 300.0):
    """What the child put on `results`; fails at once if it died first (not after the whole timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            if not child.is_alive():
                try:
                    return results.get(timeout=1.0)  # put just before it exited
                except queue.Empty:
                    pytest.fail(f"{child.name} exited with code {child.exitcode} before giving its result")
    pytest.fail(f"{child.name} gave no result in {timeout:.0f} s")


@pytest.mark.parametrize("encoder_dtype", ["float32", "bfloat16"])
def test_learner_weights_reach_a_policy_worker_through_cuda_ipc_and_it_acts_as_the_learner(processes, encoder_dtype):
    cfg = gpu_cfg(encoder_dtype=encoder_dtype)
    runner_model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    weights = appo.SharedWeights(runner_model, device=CUDA)  # the runner's allocation (create_shared)
    assert weights.flat.device.type == CUDA.type and weights.buffer.size == 16  # only the seqlock counters on the host
    results = processes.Queue()
    for target in (learner_publishes, policy_worker_loads):
        child = processes.Process(target=target, args=(weights, cfg, results))
        child.start()
        outputs = result_of(child, results)
        child.join(timeout=60)
        assert child.exitcode == 0
        if target is learner_publishes:
            learner = outputs
    worker = outputs
    assert worker["version"] == 5 and worker["on_gpu"] and worker["host_bytes"] == 16
    if encoder_dtype == "float32":  # the same weights, kernels and inputs
        np.testing.assert_array_equal(worker["actions"], learner["actions"])
        for key in ("logits", "values", "next_state"):
            np.testing.assert_allclose(worker[key], learner[key], rtol=1e-4, atol=1e-4)
    else:  # bfloat16 weights in the worker, autocast in the learner: cuDNN may pick other kernels
        assert (worker["actions"] == learner["actions"]).mean() > 0.9
        for key in ("logits", "values"):
            assert np.linalg.norm(worker[key] - learner[key]) / np.linalg.norm(learner[key]) < 0.02
    runner_copy = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)  # the runner sees it too (PBT, past opponents)
    assert weights.load_into(runner_copy) == 5
    assert not torch.equal(runner_copy.state_dict()["core.weight_ih"], runner_model.state_dict()["core.weight_ih"])


def test_a_write_in_progress_is_seen_by_a_reader_on_the_gpu():
    cfg = gpu_cfg()
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA)
    weights = appo.SharedWeights(model, device=CUDA)
    weights.sequence[0] += 1  # a learner in the middle of publish()
    assert weights.load_into(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA)) is None
    weights.sequence[0] += 1
    assert weights.load_into(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA)) == 0


# ---------------------------------------------------------------------------------------------
# The policy worker's batch path: pinned staging, a copy per input, the outputs back in one copy
# ---------------------------------------------------------------------------------------------

def test_a_policy_worker_on_the_gpu_writes_what_its_model_computes_into_the_slots(tmp_path):
    """Two batches of different sizes through the same staging buffers: each request's slot gets
    the outputs of its own inputs, as the worker's model computes them on inputs indexed plainly."""
    cfg = gpu_cfg(tmp_path, num_workers=2, num_envs_per_worker=6, worker_num_splits=2)
    spaces_pair = (IMAGE_AND_VECTOR, TWO_HEADS)
    probe = appo.EnvProbe(spaces_pair, num_agents=1, reward_shaping=None)
    shared = appo.create_shared(cfg, appo.ActorCritic(*spaces_pair, cfg), probe)
    worker = appo.PolicyWorker(0, cfg, shared, spaces_pair)
    if CUDA.type == "cuda":
        assert worker.staging.host_inputs["obs"].is_pinned() and worker.staging.host_outputs.is_pinned()
    tensors, control = shared.slots.tensors, shared.slots.control
    generator = torch.Generator().manual_seed(3)
    tensors["obs"].copy_(torch.randint(0, 256, tensors["obs"].shape, dtype=torch.uint8, generator=generator))
    for name in ("measurements", "rnn_state"):
        tensors[name].copy_(torch.randn(tensors[name].shape, generator=generator))
    worker.version = 3
    for workers in ([0, 1], [1]):
        messages, rows = [], []
        for worker_id in workers:
            for split in range(2):
                actors = [appo.Actor(env_id, 0, 0) for env_id in range(3)]
                for actor in actors:
                    actor.slot, actor.step = control.acquire(worker_id), int(torch.randint(0, cfg.rollout, (),
                                                                                           generator=generator))
                    rows.append((actor.slot, actor.step))
                messages.append(appo.action_request(worker_id, split, control.set_pending(worker_id, split, 3), actors))
        worker.act_on(messages)
        slots, steps = torch.tensor(rows).T
        with torch.inference_mode():
            logits, values, next_state = worker.model(
                {key: tensors[key][slots, steps].to(CUDA) for key in ("obs", "measurements")},
                tensors["rnn_state"][slots, steps].to(CUDA))
            actions = tensors["actions"][slots, steps]
            log_probs = worker.model.action_dist.log_prob(logits, actions.to(CUDA))
        assert ((actions >= 0) & (actions < torch.tensor([3, 4]))).all()
        np.testing.assert_allclose(tensors["value"][slots, steps], values.cpu(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tensors["rnn_state"][slots, steps + 1], next_state.cpu(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tensors["log_prob"][slots, steps], log_probs.cpu(), rtol=1e-5, atol=1e-5)
        assert (tensors["policy_version"][slots, steps] == 3).all()
        assert all(control.pending(w, split) == 0 for w in workers for split in range(2))


# ---------------------------------------------------------------------------------------------
# Learner batches: pinned, non-blocking, and the slots free for reuse at once
# ---------------------------------------------------------------------------------------------

def test_pinned_non_blocking_batches_arrive_intact_though_the_slots_are_reused_at_once(tmp_path):
    cfg = gpu_cfg(tmp_path)
    specs = appo.rollout_buffer_specs(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    slots_per_batch = cfg.batch_size // cfg.rollout
    slots = appo.RolloutSlots(specs, num_slots=2 * slots_per_batch, rollout=cfg.rollout, num_workers=1, num_splits=1)
    spaces_pair = (IMAGE_AND_VECTOR, TWO_HEADS)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, spaces_pair, slots=slots), spaces_pair)
    generator = torch.Generator().manual_seed(0)
    for round_ in range(5):
        taken = [slots.control.acquire(0, timeout=1.0) for _ in range(slots_per_batch)]
        for name, tensor in slots.tensors.items():
            if tensor.dtype == torch.uint8:
                tensor.copy_(torch.randint(0, 256, tensor.shape, dtype=torch.uint8, generator=generator))
            elif tensor.dtype == torch.int64:
                tensor.copy_(torch.randint(0, 1 << 40, tensor.shape, generator=generator))
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator))
        expected = {name: value.clone() for name, value in gather_slots(slots, taken).items()}
        expected["rnn_state"] = expected["rnn_state"][[0, -1]]  # the learner reads only the first and the last
        batch = learner.take_batch(taken)  # copies are queued, maybe not done when it returns
        for tensor in slots.tensors.values():  # the rollout workers refill the freed slots at once
            tensor.zero_()
        synchronize()
        done_host = batch.pop("done_host", None)  # SegmentRNN's plan reads this host copy
        if learner.segments is not None:
            assert isinstance(done_host, np.ndarray) and np.array_equal(done_host, expected["done"].numpy())
        for name, value in batch.items():
            assert value.device.type == CUDA.type and value.shape == expected[name].shape, name
            assert torch.equal(value.cpu(), expected[name]), f"round {round_}: {name} differs"
        with pytest.raises(ValueError, match="free already"):  # take_batch gave every slot back
            slots.control.release(taken)


@pytest.mark.skipif(ON_CPU, reason="CUDA events need a GPU")
def test_a_gpu_stage_reports_the_gpu_time_of_its_finished_runs():
    """StageTimes' gpu_stages: the learner's "sgd_gpu" and the policy worker's "forward_gpu"."""
    times = appo.StageTimes("sgd", "publish", gpu_stages=("sgd",))
    x = torch.randn(2048, 2048, device=CUDA)
    for _ in range(3):
        with times("sgd"):
            x = (x @ x).tanh_()
    torch.cuda.synchronize()
    taken = times.take()
    assert set(taken) == {"sgd", "sgd_gpu", "publish"} and taken["sgd_gpu"] > 0.0
    assert times.take()["sgd_gpu"] == 0.0


def test_a_learner_step_on_the_gpu_trains_on_a_batch_from_the_slots(tmp_path):
    cfg = gpu_cfg(tmp_path, encoder_dtype="bfloat16")
    specs = appo.rollout_buffer_specs(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    slots_per_batch = cfg.batch_size // cfg.rollout
    slots = appo.RolloutSlots(specs, num_slots=slots_per_batch, rollout=cfg.rollout, num_workers=1, num_splits=1)
    weights = appo.SharedWeights(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg), device=CUDA)
    run = types.SimpleNamespace(learner_frames=np.zeros(1, np.int64), learner_version=np.zeros(1, np.int64))
    shared = types.SimpleNamespace(slots=slots, weights=[weights], run=run,
                                   hyperparams=appo.PolicyHyperparams(cfg, None))
    learner = appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS))
    taken = [slots.control.acquire(0, timeout=1.0) for _ in range(slots_per_batch)]
    slots.tensors["obs"].copy_(torch.randint(0, 256, slots.tensors["obs"].shape, dtype=torch.uint8))
    slots.tensors["measurements"].normal_()
    slots.tensors["actions"][..., 0].random_(0, 3)
    slots.tensors["actions"][..., 1].random_(0, 4)
    slots.tensors["log_prob"].fill_(-2.0)
    slots.tensors["reward"].normal_()
    slots.tensors["valid"].fill_(1.0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    stats = learner.train_step(learner.take_batch(taken))
    assert np.isfinite(stats["loss"]) and learner.policy_version == 1 and weights.version == 1
    changed = [k for k, v in learner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("encoders") for k in changed) and any(k.startswith("core") for k in changed)
    policy_model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg).to(CUDA)
    assert weights.load_into(policy_model) == 1  # the published weights are the trained ones
    for key, value in learner.model.state_dict().items():
        assert torch.equal(policy_model.state_dict()[key], value), key


def learner_on_slots(cfg, slots) -> appo.Learner:
    weights = appo.SharedWeights(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg), device=CUDA)
    run = types.SimpleNamespace(learner_frames=np.zeros(1, np.int64), learner_version=np.zeros(1, np.int64))
    shared = types.SimpleNamespace(slots=slots, weights=[weights], run=run,
                                   hyperparams=appo.PolicyHyperparams(cfg, None))
    return appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS))


@pytest.mark.parametrize("rnn_type, with_vtrace", [("gru", True), ("lstm", False)])
def test_a_learner_step_on_the_gpu_runs_the_rnn_over_episode_segments_and_its_loss_is_the_loops(
        tmp_path, monkeypatch, rnn_type, with_vtrace):
    """On a GPU a learner's batch carries a host copy of the dones, and its step runs the RNN over
    the episode segments in one cuDNN call instead of a loop of cell steps; from the same weights,
    batch and seed, its loss is the loop's within cuDNN's float32 rounding."""
    cfg = gpu_cfg(tmp_path, rnn_type=rnn_type, with_vtrace=with_vtrace, num_epochs=1, num_batches_per_epoch=1)
    specs = appo.rollout_buffer_specs(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    slots_per_batch = cfg.batch_size // cfg.rollout
    slots = appo.RolloutSlots(specs, num_slots=slots_per_batch, rollout=cfg.rollout, num_workers=1, num_splits=1)
    generator = torch.Generator().manual_seed(7)
    slots.tensors["obs"].copy_(torch.randint(0, 256, slots.tensors["obs"].shape, dtype=torch.uint8,
                                             generator=generator))
    for name in ("measurements", "rnn_state", "reward"):
        slots.tensors[name].copy_(torch.randn(slots.tensors[name].shape, generator=generator))
    slots.tensors["done"].copy_((torch.rand(slots.tensors["done"].shape, generator=generator) < 0.2).float())
    slots.tensors["actions"][..., 0].random_(0, 3, generator=generator)
    slots.tensors["actions"][..., 1].random_(0, 4, generator=generator)
    slots.tensors["log_prob"].fill_(-2.0)
    slots.tensors["valid"].fill_(1.0)
    segments, loop = learner_on_slots(cfg, slots), learner_on_slots(cfg, slots)
    loop.model.load_state_dict(segments.model.state_dict())
    batch = segments.take_batch([slots.control.acquire(0, timeout=1.0) for _ in range(slots_per_batch)])
    assert "done_host" in batch
    calls, stats = {}, {}
    for name, learner, its_batch in (("segments", segments, batch),
                                     ("loop", loop, {k: v for k, v in batch.items() if k != "done_host"})):
        calls[name], core_step = [], learner.model.core_step
        monkeypatch.setattr(learner.model, "core_step",
                            lambda *args, seen=calls[name], step=core_step: seen.append(1) or step(*args))
        torch.manual_seed(0)  # the input normaliser's sample
        stats[name] = learner.train_step(its_batch, report=True)
    assert len(calls["segments"]) == (0 if with_vtrace else 1)  # GAE's bootstrap is one step of the cell
    assert len(calls["loop"]) > cfg.rollout
    assert np.isfinite(stats["segments"]["loss"])
    assert abs(stats["segments"]["loss"] - stats["loop"]["loss"]) <= 1e-4 * abs(stats["loop"]["loss"]), stats


# ---------------------------------------------------------------------------------------------
# bfloat16 autocast on the GPU
# ---------------------------------------------------------------------------------------------

def test_auto_picks_bfloat16_on_this_gpu_when_it_computes_it_natively():
    cfg = appo.parse_args(["--env", "doom_basic", "--device", CUDA.type])
    assert cfg.encoder_dtype == ("bfloat16" if appo.native_bfloat16(CUDA.type) else "float32")
    if CUDA.type == "cuda":
        assert appo.native_bfloat16("cuda") == torch.cuda.is_bf16_supported(including_emulation=False)


def test_bfloat16_autocast_on_the_gpu_computes_the_encoder_in_bf16_and_keeps_float32_weights_and_grads():
    torch.manual_seed(0)
    model32 = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, gpu_cfg()).to(CUDA)
    model16 = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, gpu_cfg(encoder_dtype="bfloat16")).to(CUDA)
    model16.load_state_dict(model32.state_dict())
    obs = random_obs(16, seed=3)
    assert next(iter(obs.values())).device.type == CUDA.type
    check_bfloat16_encoder(model32, model16, obs)


@pytest.mark.skipif(ON_CPU, reason="torch's sync debug mode needs CUDA")
def test_a_learner_step_on_the_gpu_waits_for_it_at_most_once_when_no_report_is_due(tmp_path):
    """gpu-analysis: about 20 host synchronisations a step on the H200 (.item() statistics, the
    finite check, the normaliser's boolean index). torch's sync debug mode warns at each implicit one."""
    cfg = gpu_cfg(tmp_path, num_epochs=2, num_batches_per_epoch=2, batch_size=16)  # 2 x 2 SGD steps on 2 x 8
    slots_per_batch = cfg.batch_size // cfg.rollout
    specs = appo.rollout_buffer_specs(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    slots = appo.RolloutSlots(specs, num_slots=2 * slots_per_batch, rollout=cfg.rollout, num_workers=1, num_splits=1)
    weights = appo.SharedWeights(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg), device=CUDA)
    run = types.SimpleNamespace(learner_frames=np.zeros(1, np.int64), learner_version=np.zeros(1, np.int64))
    shared = types.SimpleNamespace(slots=slots, weights=[weights], run=run, hyperparams=appo.PolicyHyperparams(cfg, None))
    learner = appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS))
    assert learner.optimizer.defaults["fused"]
    slots.tensors["log_prob"].fill_(-2.0)
    slots.tensors["valid"].fill_(1.0)
    batch = learner.take_batch([slots.control.acquire(0, timeout=1.0) for _ in range(slots_per_batch)])
    learner.train_step(batch, report=True)  # the first: cuDNN's tuning and the allocator's growth
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert learner.train_step(batch, report=False) == {}
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [str(warning.message) for warning in caught if "synchroniz" in str(warning.message)]
    assert len(syncs) <= 1, syncs


# ---------------------------------------------------------------------------------------------
# Checkpoints move between GPU and CPU
# ---------------------------------------------------------------------------------------------

def trained_learner(cfg) -> appo.Learner:
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    torch.manual_seed(5)
    obs = random_obs(8, seed=4, device=learner.device)
    logits, values, _ = learner.model(obs, torch.zeros(8, appo.rnn_state_size(cfg), device=learner.device))
    appo.optimizer_step(learner.model, learner.optimizer, logits.square().mean() + values.square().mean(), cfg)
    learner.policy_version, learner.env_frames = 3, 1234
    return learner


@pytest.mark.parametrize("saved_on, loaded_on", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_saved_on_one_device_resumes_on_the_other_and_trains(tmp_path, saved_on, loaded_on):
    """The weights and fused Adam's state survive the move (its step counts too, which fused Adam
    needs on the parameters' device), and the resumed learner takes a step."""
    def learner_on(side):
        return gpu_cfg(tmp_path, device=CUDA.type if side == "cuda" else "cpu")

    saved = trained_learner(learner_on(saved_on))
    saved.save()
    loaded_cfg = learner_on(loaded_on)
    spaces_pair = (IMAGE_AND_VECTOR, TWO_HEADS)
    resumed = appo.Learner(0, loaded_cfg, outside_a_run(loaded_cfg, spaces_pair), spaces_pair)
    loaded_on = resumed.device.type
    assert all(group["fused"] for group in resumed.optimizer.param_groups)
    assert resumed.policy_version == 3 and resumed.env_frames == 1234
    for key, value in saved.model.state_dict().items():
        assert resumed.model.state_dict()[key].device.type == loaded_on
        assert torch.equal(resumed.model.state_dict()[key].cpu(), value.cpu()), key
    moments = [state["exp_avg"] for state in resumed.optimizer.state.values()]
    assert moments and all(m.device.type == loaded_on for m in moments)  # Adam's state followed the weights
    obs = random_obs(8, seed=6, device=resumed.device)
    logits, values, _ = resumed.model(obs, torch.zeros(8, appo.rnn_state_size(resumed.cfg), device=resumed.device))
    loss = logits.square().mean() + values.square().mean()
    _, skipped = appo.optimizer_step(resumed.model, resumed.optimizer, loss, resumed.cfg)
    assert skipped.item() == 0  # a step on the new device


def test_evaluation_on_the_gpu_plays_a_checkpoint_trained_on_the_cpu(tmp_path, capsys):
    cfg = appo.parse_args(["--env", "doom_basic", "--device", "cpu", "--train_dir", str(tmp_path)])
    spaces_pair = appo.probe_env(cfg).spaces
    learner = appo.Learner(0, cfg, outside_a_run(cfg, spaces_pair), spaces_pair)
    learner.save()
    code = appo.main(["--mode", "eval", "--env", "doom_basic", "--device", CUDA.type, "--train_dir", str(tmp_path),
                      "--max_num_episodes", "2"])
    out = capsys.readouterr().out
    assert code == 0 and f"on {CUDA.type}" in out and "mean return" in out
