"""appo.py's PLUMBING: learner: the Learner's step (SegmentRNN, its reads back to the host, its
statistics, non-finite losses), its first weights and checkpoints, and its own loop on real slots."""
import copy
import re
import types

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

import appo
import appo_ipc
from conftest import (IMAGE_AND_VECTOR, TWO_HEADS, fake_batch, learner_with_weights, outside_a_run, random_obs,
                      small_cfg)


# ---------------------------------------------------------------------------------------------
# The recurrent core over episode segments (SegmentRNN), and when the learner keeps the model's loop

@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_the_rnn_over_episode_segments_equals_the_loop_in_outputs_and_gradients(rnn_type):
    """The model's loop of core_step over a rollout, and the learner's SegmentRNN (its accelerator
    on a GPU): one nn.GRU/nn.LSTM call over the rollout cut at episode ends, planned from a host copy
    of the dones, here for columns 1-5 of a batch of 7 (a minibatch, found by its view's offset).
    Both also equal stepping forward() with the rollout worker's reset, so a reset dropped from
    either path, or from both, fails; dones that are not a view of the batch's take the loop."""
    torch.manual_seed(2)
    cfg = small_cfg(rnn_type=rnn_type)
    obs_space = spaces.Dict({"obs": spaces.Box(-1, 1, (5,), np.float32)})
    model = appo.ActorCritic(obs_space, TWO_HEADS, cfg)
    steps, batch = 7, 5
    obs = random_obs(obs_space, (steps, batch), seed=3)
    dones = torch.zeros(steps, batch)
    dones[1, 0] = dones[2, 0] = dones[6, 0] = 1.0  # two in a row, and one at the last step
    # trajectory 1 has none; 2 ends its first episode at once; 3 only at the last step
    dones[0, 2] = dones[4, 2] = dones[6, 3] = dones[5, 4] = 1.0
    plan = appo.rnn_segments(dones.numpy())
    assert plan.num_segments == batch + 5 and plan.max_len == steps
    first_state = torch.randn(batch, appo.rnn_state_size(cfg))
    logit_weights, value_weights = torch.randn(steps, batch, 7), torch.randn(steps, batch)
    outputs, gradients = {}, {}
    loop_model = copy.deepcopy(model)
    segments = appo.SegmentRNN(model)
    batch_dones = torch.cat([torch.ones(steps, 1), dones, torch.ones(steps, 1)], dim=1)  # the batch: 7 columns
    segments.use(batch_dones, batch_dones.numpy().copy())
    called = []
    segments.loop = lambda *args: called.append(1)
    for path, its_model in (("loop", loop_model), ("segments", model)):
        state = first_state.clone().requires_grad_(True)
        logits, values = its_model.forward_rollout(obs, state, batch_dones[:, 1:6])
        objective = (logits * logit_weights).sum() + (values * value_weights).sum()
        outputs[path] = (logits.detach(), values.detach())
        gradients[path] = torch.autograd.grad(objective, [state, *its_model.parameters()])
    for ours, loops in zip(outputs["segments"], outputs["loop"]):
        torch.testing.assert_close(ours, loops, rtol=1e-5, atol=1e-5)
    names = ["first_rnn_state", *(name for name, _ in model.named_parameters())]
    for name, ours, loops in zip(names, gradients["segments"], gradients["loop"], strict=True):
        torch.testing.assert_close(ours, loops, rtol=1e-5, atol=1e-5, msg=name)
    state = first_state
    with torch.no_grad():
        for t in range(steps):
            step_logits, step_values, state = model({key: value[t] for key, value in obs.items()}, state)
            torch.testing.assert_close(outputs["segments"][0][t], step_logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(outputs["segments"][1][t], step_values, rtol=1e-5, atol=1e-5)
            state = state * (1 - dones[t]).unsqueeze(1)
    assert called == [] and set(model.state_dict()) == set(loop_model.state_dict())
    segments.loop(None, None, None)
    assert segments(None, None, dones.clone()) is None and called == [1, 1]  # not the batch's: the loop


class LayerNormGRUCell(nn.GRUCell):
    """A forker's edit: a GRU cell whose new state is layer-normalised, as a subclass of torch's cell."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__(input_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size)

    def forward(self, x, state):
        return self.norm(super().forward(x, state))


def test_a_cell_of_ones_own_acts_and_trains_through_its_own_code_and_keeps_the_models_loop(tmp_path):
    """docs/fork.md's recurrent core: a GRUCell subclass with a forward of its own put in model.core
    is what forward() and the loss run (its LayerNorm gets gradients from the loss), and the learner
    keeps the model's loop for it: SegmentRNN (an nn.GRU on the cell's weights) would train a plain
    GRU. So does an edited core_step around torch's own cell; torch's own cells get SegmentRNN."""
    torch.manual_seed(5)
    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="gru", with_vtrace=True)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    assert appo.SegmentRNN.for_model(model) is not None
    model.core = LayerNormGRUCell(cfg.hidden_size, cfg.hidden_size)
    features, state = torch.randn(5, cfg.hidden_size), torch.randn(5, cfg.hidden_size)
    output, next_state = model.core_step(features, state)
    torch.testing.assert_close(output, model.core(features, state))
    torch.testing.assert_close(output.mean(dim=1), torch.zeros(5), atol=1e-5, rtol=0)  # normalised: it ran
    assert appo.SegmentRNN.for_model(model) is None
    assert "own core_over_rollout" in appo.SegmentRNN.path(model)
    loss, _ = appo.appo_loss(model, fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4), 0, cfg)
    loss.backward()
    assert model.core.norm.weight.grad is not None and model.core.norm.weight.grad.abs().sum() > 0

    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    assert learner.segments is not None and "nn.GRU" in appo.SegmentRNN.path(learner.model)
    edited = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, small_cfg(rnn_type="lstm"))
    assert "nn.LSTM" in appo.SegmentRNN.path(edited)
    step = edited.core_step
    edited.core_step = lambda x, h: (lambda out, new: (torch.tanh(out), new))(*step(x, h))  # one edit in core_step
    assert appo.SegmentRNN.for_model(edited) is None


class ZeroSkip(appo.ActorCritic):
    """A fork's core_step edit that adds nothing at the start: a learned skip around the GRU, its
    weights zero (an adapter's usual start), so the outputs are the plain GRU's until it trains."""

    def __init__(self, *args):
        super().__init__(*args)
        self.skip = torch.nn.Linear(self.core.input_size, self.core.hidden_size)
        torch.nn.init.zeros_(self.skip.weight)
        torch.nn.init.zeros_(self.skip.bias)

    def core_step(self, features, rnn_state):
        output, next_state = super().core_step(features, rnn_state)
        return output + self.skip(features), next_state


def test_a_zero_initialised_skip_in_core_step_keeps_the_loop_so_its_weights_train(tmp_path, monkeypatch):
    """SegmentRNN computes the cell alone: its outputs equal the loop's while the skip is zero, but
    it never calls core_step, so the skip would get no gradient, ever. Its check compares gradients
    too, and the loop trains the skip."""
    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="gru")
    assert appo.SegmentRNN.for_model(appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)) is not None
    monkeypatch.setattr(appo, "ActorCritic", ZeroSkip)  # the learner builds the fork's model
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    assert learner.segments is None and "own core_over_rollout" in appo.SegmentRNN.path(learner.model)
    learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))
    assert learner.model.skip.weight.abs().sum() > 0  # it trained


def test_a_learner_trains_a_model_without_a_recurrent_core_or_core_over_rollout(tmp_path, monkeypatch):
    """A replacement model that keeps only the documented contract (no core, no core_over_rollout)
    starts and trains: the learner reaches for SegmentRNN only where the model holds torch's own
    cell."""

    class NoCore(appo.ActorCritic):
        def __getattribute__(self, name):
            if name in ("core", "core_over_rollout"):
                raise AttributeError(name)
            return super().__getattribute__(name)

        def forward_rollout(self, obs, first_rnn_state, dones):
            steps, batch = dones.shape
            features = self.encode({key: appo.trajectory_major(value) for key, value in obs.items()})
            features = features.view(batch, steps, -1).transpose(0, 1)
            return self.mask_logits(self.action_logits(features), obs), self.value_head(features).squeeze(-1)

    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="none")
    monkeypatch.setattr(appo, "ActorCritic", NoCore)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    assert learner.segments is None and not hasattr(learner.model, "core_over_rollout")
    assert appo.SegmentRNN.path(learner.model) == "none"
    assert learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))["skipped_steps"] == 0


def test_the_learner_asks_for_cudnns_rnn_in_full_float32_on_any_torch(monkeypatch):
    """The segment path's cuDNN RNN must compute as the policy workers' cell does. Since torch 2.9
    that is cudnn.rnn.fp32_precision; on an older torch (a stand-in module without it) the older
    allow_tf32, which `hasattr(torch.backends.cudnn, "rnn")` (always true) used to skip."""
    monkeypatch.setattr(torch.backends.cudnn.rnn, "fp32_precision", "tf32")
    appo.rnn_in_full_float32()
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    older_cudnn = types.SimpleNamespace(rnn=types.SimpleNamespace(), allow_tf32=True)
    monkeypatch.setattr(torch.backends, "cudnn", older_cudnn)
    appo.rnn_in_full_float32()
    assert older_cudnn.allow_tf32 is False


# ---------------------------------------------------------------------------------------------
# A learner's step: what it reads back, the statistics it reports, non-finite losses

HOST_READS = ["item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "nonzero"]


def record_host_reads(monkeypatch) -> list[str]:
    """Every read of a tensor's value on the host (on a GPU each waits for every queued kernel):
    the methods that read one, boolean indexing (its size is read), and publish's wait for its copies.
    Not counted: reads of a SegmentRNN plan's batch_sizes, which torch keeps on the host (a
    PackedSequence's), so that reading them waits for nothing on any device."""
    reads, plans = [], []
    real_segments = appo.rnn_segments
    monkeypatch.setattr(appo, "rnn_segments", lambda dones: plans.append(plan := real_segments(dones)) or plan)

    def counting(name, original):
        def read(self, *args, **kwargs):
            if not (torch.is_tensor(self) and any(self.data_ptr() == plan.batch_sizes.ctypes.data for plan in plans)):
                reads.append(name)
            return original(self, *args, **kwargs)
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    original_getitem = torch.Tensor.__getitem__

    def getitem(self, index):
        indices = index if isinstance(index, tuple) else (index,)
        if any(torch.is_tensor(i) and i.dtype == torch.bool for i in indices):
            reads.append("boolean index")
        return original_getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    monkeypatch.setattr(appo_ipc, "wait_for_copies", counting("publish", lambda tensor: None))  # where publish finds it
    return reads


def as_take_batch_hands_it_over(batch: dict[str, torch.Tensor], device: torch.device) -> dict:
    """A batch [T+1, B, ...] through BatchBuffers, from slot-shaped trajectory-major copies, as
    Learner.take_batch hands it to train_step (with "done_host", for SegmentRNN)."""
    slot_tensors = {name: value.transpose(0, 1).contiguous() for name, value in batch.items()}
    trajectories = batch["done"].shape[1]
    buffers = appo.BatchBuffers(slot_tensors, trajectories, device, dones_on_host=True)
    return buffers.fill(slot_tensors, torch.arange(trajectories))


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_a_learner_step_reads_once_and_only_to_publish(tmp_path, monkeypatch, with_vtrace):
    """gpu-analysis: a learner step on the H200 waited for the GPU about 20 times (statistics'
    .item(), the finite check, the return normaliser's boolean index, publish). A step of four SGD
    steps reads once, to publish; a step whose report is due reads its statistics once more: the
    optimizer's skip and the normalisers stay on the device, on every device. Its RNN runs over
    episode segments planned from the batch's host copy of the dones (the cell steps only for GAE's
    bootstrap), on the CPU as on a GPU.

    What it counts is calls to the patched Tensor methods above, on the CPU: a read they do not
    cover (torch.nonzero, np.asarray of a tensor, a sync inside a kernel) goes unseen. The GPU's
    real synchronisations are counted by tests/test_cuda.py's
    test_a_learner_step_on_the_gpu_waits_for_it_at_most_once_when_no_report_is_due (torch's sync
    debug mode), which passed on an H200 on 2026-11-28."""
    cfg = small_cfg(train_dir=str(tmp_path), with_vtrace=with_vtrace, num_epochs=2, num_batches_per_epoch=2,
                    normalize_returns=True, normalize_input=True)
    learner = learner_with_weights(cfg)
    assert learner.optimizer.defaults["fused"]
    trajectories = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4)
    trajectories["done"][2, 1] = trajectories["done"][3, 3] = 1.0
    batch = as_take_batch_hands_it_over(trajectories, learner.device)
    assert np.array_equal(batch["done_host"], trajectories["done"].numpy())
    cell_steps, core_step = [], learner.model.core_step
    monkeypatch.setattr(learner.model, "core_step", lambda *args: cell_steps.append(1) or core_step(*args))
    reads = record_host_reads(monkeypatch)
    assert learner.train_step(batch, report=False) == {}
    assert reads == ["publish"]
    reads.clear()
    stats = learner.train_step(batch, report=True)
    assert reads == ["tolist", "publish"]
    assert isinstance(stats["loss"], float) and stats["skipped_steps"] == 0 and learner.policy_version == 2
    assert len(cell_steps) == (0 if with_vtrace else 2)  # the loop would step it 7 times a minibatch


def test_a_loss_whose_statistics_are_floats_still_reports_them(tmp_path, monkeypatch):
    """docs/fork.md asks for 0-dim tensors; a forker's appo_loss whose numbers are floats still trains and shows them."""
    cfg = small_cfg(train_dir=str(tmp_path))
    learner = learner_with_weights(cfg)
    real_loss = appo.appo_loss

    def float_stats(*args, **kwargs):
        loss, aux = real_loss(*args, **kwargs)
        return loss, {name: value.item() if value.dim() == 0 else value for name, value in aux.items()}

    monkeypatch.setattr(appo, "appo_loss", float_stats)
    stats = learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))
    assert isinstance(stats["entropy"], float) and stats["skipped_steps"] == 0


def test_an_objective_that_returns_only_its_loss_trains_and_the_status_line_shows_what_it_has(tmp_path, monkeypatch):
    """Issue 52: the status line read lag_min/avg/max from the loss's stats and raised KeyError without them."""
    cfg = small_cfg(train_dir=str(tmp_path), num_workers=2)
    learner = learner_with_weights(cfg)
    monkeypatch.setattr(appo, "appo_loss", lambda model, batch, *args, **kwargs: (
        model.forward_rollout({key: batch[key] for key in model.encoders}, batch["rnn_state"][0],
                              batch["done"])[1].square().mean(), {}))
    stats = learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))
    assert set(stats) == {"grad_norm", "skipped_steps", "learning_rate"}
    runner = appo.Stats(1)
    runner.consume({"type": "learner", "policy_id": 0, "train_s": 0.1, "policy_version": 1, **stats})
    shared = types.SimpleNamespace(run=types.SimpleNamespace(worker_frames=np.array([100, 100]),
                                                             learner_frames=np.array([200])), resumed_frames=0)
    assert "| trained 200" in appo.status_line(cfg, runner, shared, elapsed=1.0)


def test_too_many_nonfinite_steps_in_a_row_stop_the_learner_when_its_report_is_due(tmp_path):
    cfg = small_cfg(train_dir=str(tmp_path))
    learner = learner_with_weights(cfg)
    bad = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4)
    bad["reward"][:] = float("nan")
    for _ in range(appo.MAX_NONFINITE_STEPS - 1):
        assert learner.sgd_step(bad, report=False) == {}  # not read back: no report is due
    with pytest.raises(appo.NonFiniteLoss, match=f"{appo.MAX_NONFINITE_STEPS} steps in a row had a non-finite loss"):
        learner.sgd_step(bad, report=True)


# ---------------------------------------------------------------------------------------------
# Its first weights and its checkpoints

def test_a_learner_starts_from_the_weights_published_as_version_0(tmp_path):
    """The first batches were acted by version 0, the weights the runner drew and published: the
    learner trains those (its own draw would train other weights than acted, counted as lag 0)."""
    cfg = small_cfg(train_dir=str(tmp_path))
    shared = outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS))
    published = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    assert shared.weights[0].load_into(published) == 0
    learner = appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS))
    for key, value in published.state_dict().items():
        assert torch.equal(learner.model.state_dict()[key], value), key


def test_a_checkpoint_of_a_plain_adam_resumes_into_fused_adam_and_the_next_step_is_taken(tmp_path):
    """Checkpoints saved before 2026-11-28 hold a plain Adam's groups (the CPU's learner had one):
    torch would restore that setting, and a plain Adam refuses optimizer_step's found_inf."""
    cfg = small_cfg(train_dir=str(tmp_path))
    batch = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4)
    saved = learner_with_weights(cfg)
    saved.sgd_step(batch)
    state = saved.checkpoint_state()
    state["optimizer"]["param_groups"] = [{**group, "fused": None} for group in state["optimizer"]["param_groups"]]
    appo.save_checkpoint(cfg, 0, state)
    resumed = learner_with_weights(cfg)
    assert resumed.policy_version == saved.policy_version
    assert all(group["fused"] for group in resumed.optimizer.param_groups)
    steps = [state["step"] for state in resumed.optimizer.state.values()]
    assert steps and all(step.item() == 1 and step.dtype == torch.float32 for step in steps)
    stats = resumed.sgd_step(batch)
    assert stats["skipped_steps"] == 0
    assert all(state["step"].item() == 2 for state in resumed.optimizer.state.values())


# ---------------------------------------------------------------------------------------------
# In its own loop, on real slots

def learner_on_real_slots(cfg, num_slots: int):
    """A Learner over real rollout slots and a real queue, whose first report to the runner stops it:
    (learner, slots, the reports). Every slot's steps are valid, with log-prob -2."""
    slots = appo.RolloutSlots(appo.rollout_buffer_specs(IMAGE_AND_VECTOR, TWO_HEADS, cfg), num_slots=num_slots,
                              rollout=cfg.rollout, num_workers=1, num_splits=1)
    slots.tensors["log_prob"].fill_(-2.0)
    slots.tensors["valid"].fill_(1.0)
    run = appo.RunState(num_workers=1, num_policies=1, num_processes=1)
    reports = []

    def report_and_stop(message):  # the runner's stats queue: one report is enough
        reports.append(message)
        run.stop[0] = 1

    shared = outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS), slots=slots, run=run,
                           learner_queues=[appo_ipc.Queue(1 << 16)],
                           stats_queue=types.SimpleNamespace(put=report_and_stop),
                           hyperparams=appo.PolicyHyperparams(cfg, None))
    return appo.Learner(0, cfg, shared, (IMAGE_AND_VECTOR, TWO_HEADS)), slots, reports


@pytest.mark.parametrize("async_rl", [False, True])
def test_a_synchronous_batch_frees_a_slot_begun_by_older_weights_and_its_actor_is_not_parked(tmp_path, async_rl):
    """--no-async_rl after a restart (bench/chaos.py met it in CI): a rollout worker restarted
    after its predecessor had handed its share acts its first slot with the weights the learner is
    training from. The learner frees that slot unused instead of training the next batch on it (lag 1,
    and every later batch a slot behind). Asynchronously, the same slot is trained on, a version
    behind. (That the gate does not park its actor for it, so its share at the new weights still
    comes, is the chaos test's: a parked actor whose slot was freed would stall its split.)"""
    cfg = small_cfg(train_dir=str(tmp_path), async_rl=async_rl)
    trajectories = appo.trajectories_per_batch(cfg)
    learner, slots, reports = learner_on_real_slots(cfg, num_slots=trajectories + 1)
    slots.tensors["policy_version"].fill_(1)
    learner.policy_version = 1  # it trained on the predecessor's share: the slot below came after
    handed_off = [(slot, slots.control.generation(slot), 0)
                  for slot in [slots.control.acquire(0, timeout=1.0) for _ in range(trajectories + 1)]]
    stale = handed_off[0][0]
    slots.arrays["policy_version"][stale, :2] = 0  # begun by version 0, the rest acted by version 1
    learner.shared.learner_queues[0].put_many(handed_off)
    learner.run(process_index=0)
    (report,) = reports
    assert report["policy_version"] == 2
    assert report["lag_max"] == (0 if not async_rl else 1), report


def test_a_learner_in_its_own_loop_reports_where_its_time_went(tmp_path):
    """The learner stages of the status line come from a real Learner.run: its loop times the
    wait for a batch, its batcher thread the copy out of the slots, its step the SGD and the
    publish, and the step's report to the runner carries all four."""
    cfg = small_cfg(train_dir=str(tmp_path))
    trajectories = appo.trajectories_per_batch(cfg)
    learner, slots, reports = learner_on_real_slots(cfg, num_slots=trajectories)
    run, shared = learner.shared.run, learner.shared
    handed_off = []  # as a rollout worker hands its finished slots to the learner
    for _ in range(trajectories):
        slot = slots.control.acquire(0, timeout=1.0)
        handed_off.append((slot, slots.control.generation(slot), 0))
    shared.learner_queues[0].put_many(handed_off)
    learner.run(process_index=0)
    (report,) = reports
    assert report["policy_version"] == 1
    assert set(report["stages"]) == {"wait", "copy", "sgd", "publish"}, report["stages"]
    assert report["stages"]["wait"] >= 0.0, report["stages"]
    assert all(report["stages"][stage] > 0.0 for stage in ("copy", "sgd", "publish")), report["stages"]
    stats = appo.Stats(1)
    stats.consume(report)
    line = appo.status_line(cfg, stats, types.SimpleNamespace(run=run, resumed_frames=0), elapsed=1.0)
    assert re.search(r"learner wait \d+% copy \d+% sgd \d+% publish \d+%", line), line
