"""The standard PPO options that appo.py's defaults leave off (issue 95): minibatches shuffled every
epoch (--shuffle_minibatches), rewards scaled by the running std of the discounted return
(--scale_rewards), input statistics taken after the SGD from every step (--input_stats
all_after_sgd) and torch's own initialisation (--policy_initialization torch_default)."""
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
from conftest import fake_batch, outside_a_run, small_cfg

VECTOR = spaces.Dict({"obs": spaces.Box(-1, 1, (5,), np.float32)})
THREE = spaces.Discrete(3)


def recorded_minibatches(monkeypatch) -> list[dict]:
    seen = []
    real_loss = appo.appo_loss

    def recording_loss(model, minibatch, policy_version, cfg):
        loss, aux = real_loss(model, minibatch, policy_version, cfg)
        seen.append({"batch": {key: value.clone() for key, value in minibatch.items()},
                     "log_probs": aux["log_probs"].detach().clone(), "behaviour": aux["behaviour_log_probs"].clone()})
        return loss, aux

    monkeypatch.setattr(appo, "appo_loss", recording_loss)
    return seen


def test_shuffled_single_steps_cover_the_batch_once_an_epoch_in_a_new_order_with_the_batchs_targets(
        tmp_path, monkeypatch):
    """SB3's and CleanRL's minibatches: every epoch a new permutation of all T x B steps, --batch_size
    of them each, every one with the GAE target and advantage the whole batch gave it."""
    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="none", with_vtrace=False, shuffle_minibatches=True,
                    num_epochs=2, num_batches_per_epoch=3, batch_size=8, normalize_input=False)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (VECTOR, THREE)), (VECTOR, THREE))
    steps, trajectories = 6, 4
    batch = fake_batch(VECTOR, THREE, cfg, steps, trajectories)
    batch["reward"][:steps] = torch.arange(steps * trajectories, dtype=torch.float32).view(steps, trajectories)
    expected = appo.gae_targets(learner.model, batch, 0, cfg)  # before any step, as the learner computes them
    seen = recorded_minibatches(monkeypatch)
    learner.sgd_step(batch)
    assert len(seen) == 6 and all(state["step"] == 6 for state in learner.optimizer.state.values())
    epochs = [[], []]
    for index, record in enumerate(seen):
        minibatch = record["batch"]
        assert minibatch["reward"].shape == (8 + 1, 1) and minibatch["target"].shape == (8, 1)
        names = minibatch["reward"][:-1, 0].long()  # each step's name: its place t * B + b in the batch
        epochs[index // 3] += names.tolist()
        torch.testing.assert_close(minibatch["target"][:, 0], expected["target"].reshape(-1)[names])
        torch.testing.assert_close(minibatch["advantage"][:, 0], expected["advantage"].reshape(-1)[names])
        torch.testing.assert_close(minibatch["obs"][:-1, 0], batch["obs"][:steps].reshape(-1, 5)[names])
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(steps * trajectories))
    assert epochs[0] != epochs[1] and epochs[0] != list(range(steps * trajectories))


def test_with_an_rnn_shuffled_minibatches_stay_whole_trajectories_in_a_new_order(tmp_path, monkeypatch):
    cfg = small_cfg(train_dir=str(tmp_path), shuffle_minibatches=True, num_epochs=3, num_batches_per_epoch=2)
    assert cfg.rnn_type == "gru" and not appo.single_step_minibatches(cfg)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (VECTOR, THREE)), (VECTOR, THREE))
    steps, trajectories = 6, 4
    batch = fake_batch(VECTOR, THREE, cfg, steps, trajectories)
    batch["rnn_state"][0] = torch.arange(trajectories, dtype=torch.float32).unsqueeze(1)  # names each trajectory
    seen = recorded_minibatches(monkeypatch)
    torch.manual_seed(3)
    learner.sgd_step(batch)
    orders = []
    for epoch in range(3):
        names = [record["batch"]["rnn_state"][0, :, 0].long().tolist() for record in seen[2 * epoch:2 * epoch + 2]]
        assert all(record["batch"]["reward"].shape == (steps + 1, 2) for record in seen[2 * epoch:2 * epoch + 2])
        assert sorted(names[0] + names[1]) == [0, 1, 2, 3]
        for record, ids in zip(seen[2 * epoch:2 * epoch + 2], names):  # whole trajectories: every step of each
            torch.testing.assert_close(record["batch"]["obs"], batch["obs"][:, ids])
        orders.append(names[0] + names[1])
    assert len({tuple(order) for order in orders}) > 1  # not one fixed order


def test_a_rollout_longer_than_the_minibatch_is_refused_unless_minibatches_are_single_steps():
    """rl-zoo3's HalfCheetah layout: one env, 512 steps a rollout, minibatches of 64."""
    flags = ["--env", "gym:HalfCheetah-v5", "--num_workers", "1", "--num_envs_per_worker", "1", "--worker_num_splits",
             "1", "--rollout", "512", "--batch_size", "64", "--num_batches_per_epoch", "8"]
    refused = appo.config_errors(appo.parse_args(flags))
    assert any("--rollout 512 is larger than --batch_size 64" in error and "--shuffle_minibatches" in error
               for error in refused), refused
    assert appo.config_errors(appo.parse_args(flags + ["--shuffle_minibatches"])) == []
    uneven = appo.config_errors(appo.parse_args(flags[:-1] + ["7", "--shuffle_minibatches"]))
    assert any("is not a multiple of --rollout 512" in error for error in uneven), uneven


def sb3_scaled_rewards(rewards, ends, gamma, epsilon=1e-8, clip=10.0):
    """SB3's VecNormalize reward path, one env, written as SB3 writes it: RunningMeanStd's batch
    update (count 1e-4, mean 0, var 1 to start) on the discounted return, then r / sqrt(var + eps)."""
    mean, var, count, ret, out = 0.0, 1.0, 1e-4, 0.0, []
    for reward, end in zip(rewards, ends):
        ret = ret * gamma + reward
        batch_mean, batch_var, batch_count = ret, 0.0, 1
        delta, total = batch_mean - mean, count + batch_count
        new_mean = mean + delta * batch_count / total
        m2 = var * count + batch_var * batch_count + delta ** 2 * count * batch_count / total
        mean, var, count = new_mean, m2 / total, total
        out.append(float(np.clip(reward / np.sqrt(var + epsilon), -clip, clip)))
        if end:
            ret = 0.0
    return out


def test_the_reward_scaler_is_sb3s_vecnormalize_reward_path_with_its_return_restarted_at_episode_ends():
    generator = np.random.default_rng(0)
    rewards = generator.normal(1.0, 2.0, 600).tolist()
    ends = [(t + 1) % 200 == 0 for t in range(600)]  # three episodes ended by a time limit
    scaler = appo.RewardScaler(gamma=0.99)
    scaled = [scaler(reward, episode_ended=end) for reward, end in zip(rewards, ends)]
    np.testing.assert_allclose(scaled, sb3_scaled_rewards(rewards, ends, 0.99), rtol=1e-9)
    # without the restarts the return (and so its spread) would run on across episodes
    assert not np.allclose(scaled, sb3_scaled_rewards(rewards, [False] * 600, 0.99))
    assert all(np.sign(a) == np.sign(b) for a, b in zip(scaled, rewards))  # scaled, never shifted


@pytest.mark.slow
def test_scaled_rewards_train_and_the_reported_return_stays_the_envs(tmp_path, monkeypatch):
    """A serial CartPole run with --scale_rewards: the learner's batches hold CartPole's rewards of 1
    divided by the discounted return's running std, while the run reports its true return, whole
    episodes' lengths."""
    rewards_seen = []
    real_loss = appo.appo_loss

    def recording_loss(model, minibatch, policy_version, cfg):
        rewards_seen.append(appo.steps_of(minibatch)["reward"][appo.steps_of(minibatch)["valid"] > 0].clone())
        return real_loss(model, minibatch, policy_version, cfg)

    monkeypatch.setattr(appo, "appo_loss", recording_loss)
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--serial_mode", "--num_workers", "1", "--seed", "1",
                           "--scale_rewards", "--train_for_env_steps", "4096", "--train_dir", str(tmp_path)])
    assert appo.flag_errors(cfg) == []
    result = appo.train(cfg)
    assert result.exit_code == 0
    rewards = torch.cat(rewards_seen)
    assert rewards.numel() >= 4096 and 0 < rewards.min() and rewards.max() <= 10.0  # scaled and clipped, not shifted
    assert (rewards - 1.0).abs().min() > 1e-3  # not one of CartPole's own rewards left as it was
    assert result.average_returns[0] >= 8  # CartPole's true return: at least 8 steps an episode, whatever the scale


@pytest.mark.parametrize("input_stats", ["sampled_before_sgd", "all_after_sgd"])
def test_input_statistics_after_the_sgd_leave_its_first_step_where_acting_was(tmp_path, monkeypatch, input_stats):
    """Acted by the weights about to train (lag 0), the first minibatch's ratio is exactly 1 when the
    input statistics move after the SGD (every valid step, the bootstrap row and invalid steps left
    out); updated before it, the observations the first step sees are normalised otherwise."""
    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="none", with_vtrace=False, normalize_input=True,
                    input_stats=input_stats)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (VECTOR, THREE)), (VECTOR, THREE))
    steps, trajectories = 6, 4
    batch = fake_batch(VECTOR, THREE, cfg, steps, trajectories)
    batch["obs"] = batch["obs"] * 3.0 + 2.0  # far from the statistics' start (mean 0, var 1)
    batch["valid"][2, 1] = 0.0
    with torch.no_grad():  # the behaviour log-probs of the batch's actions under the weights that train
        logits, _ = learner.model.forward_rollout({"obs": batch["obs"]}, batch["rnn_state"][0], batch["done"])
        batch["log_prob"] = learner.model.action_dist.log_prob(logits, batch["actions"])
    normalizer = learner.model.obs_normalizers["obs"]
    count = float(normalizer.count)
    seen = recorded_minibatches(monkeypatch)
    learner.sgd_step(batch)
    first = seen[0]
    same = torch.allclose(first["log_probs"], first["behaviour"], atol=1e-6)
    assert same == (input_stats == "all_after_sgd")
    if input_stats == "all_after_sgd":
        counted = batch["obs"][:steps][batch["valid"][:steps] > 0]  # [valid steps, 5], computed apart from appo
        assert float(normalizer.count) == pytest.approx(count + counted.shape[0])
        assert counted.shape[0] == steps * trajectories - 1
        weight = counted.shape[0] / (count + counted.shape[0])
        torch.testing.assert_close(normalizer.mean, counted.mean(0) * weight, rtol=1e-4, atol=1e-4)


def test_torch_default_initialisation_keeps_the_layers_as_torch_made_them():
    """--policy_initialization torch_default: torch's uniform weights within 1/sqrt(fan_in) and nonzero
    biases; orthogonal (the default): orthonormal rows or columns, zero biases."""
    layers = {}
    for scheme in ("orthogonal", "torch_default"):
        torch.manual_seed(0)
        cfg = small_cfg(rnn_type="none", policy_initialization=scheme, encoder_mlp_layers=[16, 16])
        model = appo.ActorCritic(VECTOR, THREE, cfg)
        layers[scheme] = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for layer in layers["torch_default"]:
        fan_in = layer.weight.shape[1]
        assert layer.weight.abs().max() <= 1 / math.sqrt(fan_in) + 1e-7 and layer.bias.abs().sum() > 0
    for layer in layers["orthogonal"]:
        weight = layer.weight.detach()
        gram = weight @ weight.T if weight.shape[0] <= weight.shape[1] else weight.T @ weight
        gain = 1.0 if layer.weight.shape[0] != 3 else small_cfg().policy_head_gain  # the policy head's 3 logits
        torch.testing.assert_close(gram, torch.eye(gram.shape[0]) * gain ** 2, atol=1e-5, rtol=1e-5)
        assert layer.bias.abs().sum() == 0
