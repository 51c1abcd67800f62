"""appo.py's ALGO LOGIC: the losses and the update: V-trace, GAE, the PPO, value and exploration
losses against literal formulas, and sgd_update's epochs, minibatches, optimizer steps and learning
rate."""
import argparse
import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
from conftest import IMAGE_AND_VECTOR, TWO_HEADS, fake_batch, learner_with_weights, outside_a_run, small_cfg


# ---------------------------------------------------------------------------------------------
# V-trace

def vtrace_literal(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar):
    """IMPALA's definition written out term by term, one sequence at a time (numpy, float64):
    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),
    pg_adv_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s))."""
    T = len(rewards)
    rhos = np.exp(log_rhos)
    clipped_rhos, cs = np.minimum(rhos, rho_bar), np.minimum(rhos, c_bar)
    values_ext = np.append(values, bootstrap)
    vs = np.zeros(T)
    for s in range(T):
        total = 0.0
        for t in range(s, T):
            weight = 1.0
            for i in range(s, t):
                weight *= discounts[i] * cs[i]
            delta = clipped_rhos[t] * (rewards[t] + discounts[t] * values_ext[t + 1] - values_ext[t])
            total += weight * delta
        vs[s] = values[s] + total
    vs_ext = np.append(vs, bootstrap)
    pg = np.array([clipped_rhos[s] * (rewards[s] + discounts[s] * vs_ext[s + 1] - values[s]) for s in range(T)])
    return vs, pg


def random_vtrace_inputs(shape, seed):
    rng = np.random.default_rng(seed)
    log_rhos = rng.uniform(-2.0, 2.0, shape)  # rhos from 0.14 to 7.4: both clips are crossed
    log_rhos.flat[0], log_rhos.flat[-1] = 1.5, -1.5  # at least once each, even with one step
    discounts = 0.9 * (rng.random(shape) > 0.2)  # with episode ends
    rewards = rng.normal(size=shape)
    values = rng.normal(size=shape)
    bootstrap = rng.normal(size=shape[1:])
    return log_rhos, discounts, rewards, values, bootstrap


@pytest.mark.parametrize("shape", [(7, 5), (1, 1), (6, 1), (5, 3, 2)], ids=["batch", "single-step", "batch-of-one", "higher-rank"])
def test_vtrace_matches_the_literal_formula(shape):
    rho_bar, c_bar = 1.5, 0.8
    log_rhos, discounts, rewards, values, bootstrap = random_vtrace_inputs(shape, seed=sum(shape))
    if log_rhos.size > 1:
        assert (np.exp(log_rhos) > rho_bar).any() and (np.exp(log_rhos) < c_bar).any()
    vs, pg = appo.vtrace(*(torch.tensor(x) for x in (log_rhos, discounts, rewards, values, bootstrap)),
                         rho_bar=rho_bar, c_bar=c_bar)
    flat = [x.reshape(shape[0], -1) for x in (log_rhos, discounts, rewards, values)]
    flat_bootstrap = bootstrap.reshape(-1)
    for column in range(flat[0].shape[1]):
        expected_vs, expected_pg = vtrace_literal(*(x[:, column] for x in flat), flat_bootstrap[column], rho_bar, c_bar)
        np.testing.assert_allclose(vs.numpy().reshape(shape[0], -1)[:, column], expected_vs, rtol=1e-10)
        np.testing.assert_allclose(pg.numpy().reshape(shape[0], -1)[:, column], expected_pg, rtol=1e-10)


def test_vtrace_on_policy_without_clipping_is_the_n_step_return():
    rewards = torch.tensor([1.0, 2.0, 3.0])
    discounts = torch.full((3,), 0.5)
    vs, _ = appo.vtrace(torch.zeros(3), discounts, rewards, torch.zeros(3), torch.tensor(8.0))
    # 1 + .5*2 + .25*3 + .125*8 = 3.75; 2 + .5*3 + .25*8 = 5.5; 3 + .5*8 = 7
    assert vs.tolist() == [3.75, 5.5, 7.0]


def test_vtrace_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        appo.vtrace(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 3), torch.zeros(4, 2), torch.zeros(2))
    with pytest.raises(ValueError, match="bootstrap_value"):
        appo.vtrace(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2))


def test_advantages_carry_no_gradient():
    values = torch.randn(5, 3, requires_grad=True)
    bootstrap = torch.randn(3, requires_grad=True)
    log_rhos = torch.randn(5, 3, requires_grad=True)
    vs, pg = appo.vtrace(log_rhos, torch.full((5, 3), 0.99), torch.randn(5, 3), values, bootstrap)
    returns, advantages = appo.gae(torch.randn(5, 3), values, torch.full((5, 3), 0.99), bootstrap, 0.95)
    assert not any(t.requires_grad for t in (vs, pg, returns, advantages))


# ---------------------------------------------------------------------------------------------
# PPO, value and exploration losses, the mask of old transitions, the health numbers

def loss_of_batch(model, batch, policy_version, cfg):
    """appo_loss on a whole batch, as the learner calls it (with GAE, after gae_targets)."""
    if not cfg.with_vtrace:
        batch = {**batch, **appo.gae_targets(model, batch, policy_version, cfg)}
    return appo.appo_loss(model, batch, policy_version, cfg)


def test_ppo_loss_against_a_hand_computed_example():
    # ratios e^0.5 = 1.6487 (clipped to 1.1), e^-0.5 = 0.6065 (clipped to 1/1.1 = 0.9091), 1.0
    log_probs = torch.tensor([0.5, -0.5, 0.0, 0.5])
    behaviour = torch.zeros(4)
    advantages = torch.tensor([2.0, 2.0, -1.0, -3.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last one is masked out
    loss = appo.ppo_policy_loss(log_probs, behaviour, advantages, 0.1, mask)
    # min(1.6487*2, 1.1*2) = 2.2; min(0.6065*2, 0.9091*2) = 1.2131; min(-1, -1) = -1
    expected = -(2.2 + 2 * np.exp(-0.5) - 1.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_clipped_value_loss_takes_the_pessimistic_error():
    values = torch.tensor([3.0, 0.5])
    behaviour = torch.tensor([0.0, 0.0])
    targets = torch.tensor([0.0, 1.0])
    # first: unclipped error 9, clipped value 1 -> error 1: take 9; second: 0.25 vs 0.25
    loss = appo.value_loss(values, behaviour, targets, clip_value=1.0, mask=torch.ones(2))
    assert loss.item() == pytest.approx((9.0 + 0.25) / 2)


@pytest.mark.parametrize("kind", ["entropy", "symmetric_kl"])
def test_exploration_loss_pushes_a_skewed_policy_towards_uniform(kind):
    """Both terms are smallest at the uniform policy; a gradient step on either makes the policy
    more uniform. The symmetric KL is capped at 30 as in Sample Factory."""
    cfg = argparse.Namespace(exploration_loss=kind)
    logits = torch.tensor([[2.0, 0.0, -1.0]], requires_grad=True)
    head = appo.Categoricals([3])
    loss, entropy = appo.exploration_loss(logits, head, torch.ones(1), cfg)
    loss.backward()
    with torch.no_grad():
        stepped = logits - 0.1 * logits.grad
    assert head.entropy(stepped).item() > entropy.item()
    uniform_loss, _ = appo.exploration_loss(torch.zeros(1, 3), head, torch.ones(1), cfg)
    assert uniform_loss.item() <= loss.item()
    if kind == "symmetric_kl":
        assert uniform_loss.item() == pytest.approx(0.0, abs=1e-6)
        collapsed, _ = appo.exploration_loss(torch.tensor([[200.0, -200.0, -200.0]]), head, torch.ones(1), cfg)
        assert collapsed.item() == 30.0


def test_transitions_older_than_max_policy_lag_are_masked_out():
    cfg = small_cfg(max_policy_lag=5)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    batch = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4, policy_version=0)
    batch["policy_version"][:, :2] = 10  # two trajectories are recent at version 12, two are not
    _, aux = loss_of_batch(model, batch, 12, cfg)
    stats = appo.loss_stats(model, aux, cfg)
    assert stats["valid_fraction"] == pytest.approx(0.5)
    assert stats["lag_max"] == 12 and stats["lag_min"] == 2


def test_ppo_health_numbers_against_their_formulas():
    """approx_kl = mean((r - 1) - log r), clip_fraction = share of r outside [1/(1+eps), 1+eps],
    explained_variance = 1 - Var(targets - values) / Var(targets), over the unmasked steps only."""
    behaviour = torch.zeros(2, 3)
    log_probs = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.1, 1.0, 9.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 9.0 is masked out
    targets = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    health = appo.ppo_health(log_probs, behaviour, targets.clone(), targets, mask, clip_ratio=0.2)
    ratios = torch.tensor([1.0, 1.5, 0.5, 1.1, 1.0])
    assert health["approx_kl"] == pytest.approx(float(((ratios - 1) - ratios.log()).mean()))
    assert health["clip_fraction"] == pytest.approx(2 / 5)  # 1.5 and 0.5 lie outside [0.833, 1.2]
    assert health["explained_variance"] == pytest.approx(1.0)  # values equal to the targets
    mean_only = torch.full((2, 3), 3.0)  # the unmasked targets' mean: explains nothing
    assert appo.ppo_health(behaviour, behaviour, mean_only, targets, mask, 0.2)["explained_variance"] == pytest.approx(0.0)
    assert appo.ppo_health(behaviour, behaviour, mean_only, targets, mask, 0.2)["approx_kl"] == 0.0


# ---------------------------------------------------------------------------------------------
# Targets and advantages through appo_loss, against literal formulas

def gae_literal(rewards, discounts, values, bootstrap, gae_lambda):
    """GAE written out term by term for one sequence (numpy, float64):
    A_s = sum_{t=s}^{T-1} (prod_{i=s}^{t-1} lambda gamma_i) delta_t,
    delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t), V(x_T) = bootstrap; target_s = A_s + V(x_s)."""
    T = len(rewards)
    values_ext = np.append(values, bootstrap)
    advantages = np.zeros(T)
    for s in range(T):
        for t in range(s, T):
            weight = np.prod([gae_lambda * discounts[i] for i in range(s, t)])
            advantages[s] += weight * (rewards[t] + discounts[t] * values_ext[t + 1] - values_ext[t])
    return advantages + values, advantages


VECTOR_OBS, TWO_ACTIONS = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)


def estimator_batch(steps: int, batch: int, seed: int) -> dict[str, torch.Tensor]:
    """A hand-built batch of trajectories [T+1, B] with episode ends inside the rollout (columns 0
    and 2) and at its last step (column 1). Step T's value is NaN: in the rollout slots no process
    ever writes it (step T is the next slot's step 0), so no estimator may read it."""
    generator = torch.Generator().manual_seed(seed)
    done = torch.zeros(steps + 1, batch)
    done[1, 0] = done[3, 0] = done[steps - 1, 1] = done[2, 2] = 1.0
    value = torch.randn(steps + 1, batch, generator=generator, dtype=torch.float64).float()
    value[steps] = float("nan")
    return {
        "obs": torch.zeros(steps + 1, batch, 3),
        "rnn_state": torch.zeros(steps + 1, batch, 1),
        "actions": torch.randint(0, 2, (steps + 1, batch, 1), generator=generator),
        # behaviour log-probs around the learner's log(1/2): importance ratios from 0.74 to 1.35
        "log_prob": np.log(0.5) + 0.3 * (2 * torch.rand(steps + 1, batch, generator=generator) - 1),
        "value": value,
        "reward": torch.randn(steps + 1, batch, generator=generator),
        "done": done,
        "truncated": torch.zeros(steps + 1, batch),
        "policy_version": torch.zeros(steps + 1, batch, dtype=torch.long),
        "valid": torch.ones(steps + 1, batch),
    }


def targets_and_advantages_of_appo_loss(cfg, batch, learner_values, monkeypatch):
    """Runs appo_loss with a model whose forward_rollout returns `learner_values` [T+1, B] and
    uniform two-action logits, and reads the value targets and the advantages back from the
    gradients of its loss (no entropy term, no clipping in reach, every step valid, n of them):
      value part  c * mean((v - target)^2)  ->  dL/dv = 2 c (v - target) / n
      policy part -mean(ratio * A), d log pi(a) / d logit_a = 1/2  ->  dL/dlogit_a = -ratio A / (2 n)."""
    model = appo.ActorCritic(VECTOR_OBS, TWO_ACTIONS, cfg)
    steps, batch_size = learner_values.shape[0] - 1, learner_values.shape[1]
    logits = torch.zeros(steps + 1, batch_size, 2, requires_grad=True)
    values = learner_values.clone().requires_grad_(True)
    monkeypatch.setattr(model, "forward_rollout", lambda obs, rnn_state, dones, dones_host=None: (logits, values))
    if not cfg.with_vtrace:  # GAE's bootstrap V(x_T) is one forward step of the weights about to train
        def last_step(obs, rnn_state):
            assert torch.equal(rnn_state, batch["rnn_state"][-1])  # the state acting left at step T
            return None, learner_values[-1], rnn_state
        monkeypatch.setattr(model, "forward", last_step)
        batch = {**batch, **appo.gae_targets(model, batch, 0, cfg)}
    loss, _ = appo.appo_loss(model, batch, 0, cfg)
    loss.backward()
    n = steps * batch_size
    targets = learner_values[:-1] - values.grad[:-1] * n / (2 * cfg.value_loss_coeff)
    ratio = torch.exp(np.log(0.5) - batch["log_prob"][:-1])
    logit_grad_of_taken = logits.grad[:-1].gather(-1, batch["actions"][:-1]).squeeze(-1)
    advantages = -logit_grad_of_taken * 2 * n / ratio
    return targets.double().numpy(), advantages.double().numpy()


def literal_test_cfg(with_vtrace: bool):
    return small_cfg(with_vtrace=with_vtrace, rnn_type="none", normalize_returns=False, normalize_input=False,
                     normalize_advantage=False, exploration_loss_coeff=0.0, ppo_clip_ratio=100.0, ppo_clip_value=1e6,
                     max_policy_lag=100, gamma=0.9, gae_lambda=0.8, vtrace_rho=1.0, vtrace_c=1.0)


def run_estimator_case(with_vtrace: bool, seed: int, monkeypatch):
    """One literal-formula case: the cfg, a hand-built batch of 3 trajectories of 6 steps, the learner's
    values, what appo_loss made of them (targets, advantages), and the rewards and discounts (float64)."""
    cfg = literal_test_cfg(with_vtrace=with_vtrace)
    steps, batch_size = 6, 3
    batch = estimator_batch(steps, batch_size, seed=seed)
    learner_values = torch.randn(steps + 1, batch_size, generator=torch.Generator().manual_seed(seed + 1))
    targets, advantages = targets_and_advantages_of_appo_loss(cfg, batch, learner_values, monkeypatch)
    rewards, discounts = batch["reward"][:-1].double().numpy(), cfg.gamma * (1 - batch["done"][:-1].double().numpy())
    return cfg, batch, learner_values, targets, advantages, rewards, discounts


def test_gae_through_appo_loss_bootstraps_from_the_learners_value_of_the_last_observation(monkeypatch):
    """--no-with_vtrace: GAE over the behaviour values, bootstrapped at step T with the learner's own
    V(x_T) (as Sample Factory does), since no policy worker ever evaluates step T; gae_targets
    computes them, appo_loss trains on them."""
    cfg, batch, learner_values, targets, advantages, rewards, discounts = run_estimator_case(False, 1, monkeypatch)
    for column in range(rewards.shape[1]):
        expected_targets, expected_advantages = gae_literal(
            rewards[:, column], discounts[:, column], batch["value"][:-1, column].double().numpy(),
            float(learner_values[-1, column]), cfg.gae_lambda)
        np.testing.assert_allclose(advantages[:, column], expected_advantages, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(targets[:, column], expected_targets, rtol=1e-4, atol=1e-5)


def test_vtrace_through_appo_loss_matches_the_literal_formula(monkeypatch):
    """Default V-trace: IMPALA's targets v_s on the learner's values, and the policy advantage
    r_s + gamma_s v_{s+1} - V(x_s) (the PPO ratio stands in for IMPALA's rho_s factor)."""
    cfg, batch, learner_values, targets, advantages, rewards, discounts = run_estimator_case(True, 3, monkeypatch)
    log_rhos = (np.log(0.5) - batch["log_prob"][:-1]).double().numpy()
    assert (log_rhos > 0).any() and (log_rhos < 0).any()  # rho_bar = 1 clips some ratios and not others
    values = learner_values.double().numpy()
    for column in range(rewards.shape[1]):
        expected_targets, _ = vtrace_literal(log_rhos[:, column], discounts[:, column], rewards[:, column],
                                             values[:-1, column], values[-1, column], cfg.vtrace_rho, cfg.vtrace_c)
        next_targets = np.append(expected_targets[1:], values[-1, column])
        expected_advantages = rewards[:, column] + discounts[:, column] * next_targets - values[:-1, column]
        np.testing.assert_allclose(targets[:, column], expected_targets, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(advantages[:, column], expected_advantages, rtol=1e-4, atol=1e-5)


def test_appo_loss_with_gae_asks_for_the_batchs_targets_by_name():
    """A forker calling appo_loss directly on a GAE config learns which call adds the targets."""
    cfg = small_cfg(with_vtrace=False)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    with pytest.raises(KeyError, match="gae_targets"):
        appo.appo_loss(model, fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4), 0, cfg)


# ---------------------------------------------------------------------------------------------
# The update: gradient steps, sgd_update's epochs and minibatches, the optimizer, the learning rate

@pytest.mark.parametrize("with_vtrace", [True, False])
def test_one_learner_step_changes_the_weights_and_every_parameter_gets_a_gradient(with_vtrace):
    torch.manual_seed(1)
    cfg = small_cfg(with_vtrace=with_vtrace)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss, aux = loss_of_batch(model, fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4), 0, cfg)
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    optimizer.step()
    for name, parameter in model.named_parameters():
        assert not torch.equal(parameter, before[name]), name
    stats = appo.loss_stats(model, aux, cfg)
    assert stats["valid_fraction"] == 1.0 and torch.isfinite(stats["loss"]) and not stats["loss"].requires_grad


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_the_critic_learns_the_value_of_its_observations(with_vtrace):
    """On a fixed batch whose rewards are a function of the observation (gamma 0, so the targets are
    the rewards), repeated training steps make the values explain the targets (the explained variance
    that TensorBoard shows goes to about 1); without the value loss they do not."""
    vector, actions = spaces.Dict({"obs": spaces.Box(-1, 1, (5,), np.float32)}), spaces.Discrete(3)
    explained = {}
    for value_loss_coeff in (0.5, 0.0):
        torch.manual_seed(0)
        cfg = small_cfg(gamma=0.0, with_vtrace=with_vtrace, ppo_clip_value=100.0, value_loss_coeff=value_loss_coeff)
        model = appo.ActorCritic(vector, actions, cfg)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        batch = fake_batch(vector, actions, cfg, 6, 16)
        batch["reward"] = 2.0 * batch["obs"][..., 0] + 1.0
        for _ in range(60):
            aux, skipped = appo.sgd_update(model, optimizer, batch, 0, cfg)
            assert skipped == 0
        explained[value_loss_coeff] = appo.loss_stats(model, aux, cfg)["explained_variance"]
    assert explained[0.5] > 0.9 and explained[0.0] < 0.5, explained


def test_ppo_with_v_trace_trains_a_gaussian_policy_towards_better_actions():
    """One-step episodes where the reward is -(action - 0.7)^2: the mean moves towards 0.7."""
    torch.manual_seed(0)
    cfg = small_cfg(rnn_type="none", normalize_returns=False, with_vtrace=True, exploration_loss="entropy",
                    exploration_loss_coeff=0.0)
    obs_space, box = spaces.Box(-1.0, 1.0, (1,), np.float32), spaces.Box(-2.0, 2.0, (1,), np.float32)
    model = appo.ActorCritic(obs_space, box, cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    steps, trajectories = 2, 128
    for _ in range(150):
        obs = {"obs": torch.zeros(steps + 1, trajectories, 1)}
        with torch.no_grad():
            logits, values, _ = model({"obs": obs["obs"].flatten(0, 1)}, torch.zeros(steps * trajectories + trajectories, 1))
        logits = logits.view(steps + 1, trajectories, -1)
        actions = model.action_dist.sample(logits)
        batch = {**obs, "rnn_state": torch.zeros(steps + 1, trajectories, 1), "actions": actions,
                 "log_prob": model.action_dist.log_prob(logits, actions), "value": values.view(steps + 1, trajectories),
                 "reward": -(actions[..., 0] - 0.7) ** 2, "done": torch.ones(steps + 1, trajectories),
                 "truncated": torch.zeros(steps + 1, trajectories),
                 "policy_version": torch.zeros(steps + 1, trajectories, dtype=torch.long),
                 "valid": torch.ones(steps + 1, trajectories)}
        loss, _ = loss_of_batch(model, batch, 0, cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mean = model.action_logits(model.core_step(model.encode({"obs": torch.zeros(1, 1)}),
                                               torch.zeros(1, 1))[0])[0, 0].item()
    assert abs(mean - 0.7) < 0.15, mean


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_the_learner_counts_each_batch_once_in_the_running_statistics_whatever_the_epochs(tmp_path, with_vtrace):
    """--num_epochs 3: the input and return normalisers take each batch's samples once (as in Sample
    Factory), not once per epoch; the epochs still take three optimiser steps."""
    cfg = small_cfg(train_dir=str(tmp_path), num_epochs=3, normalize_input=True, normalize_returns=True,
                    with_vtrace=with_vtrace)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    steps, batch_size = 6, 4
    batch = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, steps, batch_size)
    returns_count = float(learner.model.returns_normalizer.count)
    input_count = float(learner.model.obs_normalizers["measurements"].count)
    learner.sgd_step(batch)
    assert float(learner.model.returns_normalizer.count) == pytest.approx(returns_count + steps * batch_size)
    # every step of every trajectory, the bootstrap observation included (well under 256 samples)
    assert float(learner.model.obs_normalizers["measurements"].count) == pytest.approx(
        input_count + (steps + 1) * batch_size)
    assert all(state["step"] == 3 for state in learner.optimizer.state.values())


@pytest.mark.parametrize("with_vtrace", [True, False])
def test_minibatches_take_whole_trajectories_and_one_optimiser_step_each(tmp_path, monkeypatch, with_vtrace):
    """--num_epochs 2 --num_batches_per_epoch 2: four optimiser steps, each on two whole trajectories
    (every step of them, with their own first RNN state), the return statistics counted once."""
    cfg = small_cfg(train_dir=str(tmp_path), num_epochs=2, num_batches_per_epoch=2, normalize_returns=True,
                    with_vtrace=with_vtrace)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    steps, trajectories = 6, 4
    batch = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, steps, trajectories)
    batch["rnn_state"][0] = torch.arange(trajectories, dtype=torch.float32).unsqueeze(1)  # names each trajectory
    seen = []
    real_loss = appo.appo_loss

    def recording_loss(model, minibatch, policy_version, cfg):
        seen.append((minibatch["rnn_state"][0, :, 0].tolist(), minibatch["reward"].shape,
                     float(model.returns_normalizer.count)))
        return real_loss(model, minibatch, policy_version, cfg)

    monkeypatch.setattr(appo, "appo_loss", recording_loss)
    returns_count = float(learner.model.returns_normalizer.count)
    learner.sgd_step(batch)
    assert [trajectory_ids for trajectory_ids, _, _ in seen] == [[0.0, 1.0], [2.0, 3.0]] * 2
    assert all(shape == (steps + 1, 2) for _, shape, _ in seen)
    # the loss changes nothing; the learner folds GAE's targets in before the first step, and each
    # minibatch's V-trace targets after its step in the first epoch only
    folded = (0, 1, 2, 2) if with_vtrace else (2, 2, 2, 2)
    assert ([count - returns_count for _, _, count in seen]
            == pytest.approx([halves * steps * trajectories / 2 for halves in folded]))
    assert all(state["step"] == 4 for state in learner.optimizer.state.values())
    assert float(learner.model.returns_normalizer.count) == pytest.approx(returns_count + steps * trajectories)


def test_gae_targets_are_computed_once_per_batch_with_the_weights_before_its_first_step(tmp_path, monkeypatch):
    """--no-with_vtrace --num_epochs 2 --num_batches_per_epoch 2: all four SGD steps train on the
    targets and advantages that the batch's starting weights give (Sample Factory's order), not on a
    bootstrap re-evaluated by weights that already trained on the batch."""
    cfg = small_cfg(train_dir=str(tmp_path), with_vtrace=False, num_epochs=2, num_batches_per_epoch=2,
                    normalize_returns=True, normalize_input=False, learning_rate=1e-2)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    steps, trajectories = 6, 4
    batch = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, steps, trajectories)
    batch["done"][:] = 0.0  # every target reaches the bootstrap value
    before = copy.deepcopy(learner.model)
    expected = appo.gae_targets(before, batch, 0, cfg)
    seen = []
    real_loss = appo.appo_loss

    def recording_loss(model, minibatch, policy_version, cfg):
        seen.append((minibatch["target"].clone(), minibatch["advantage"].clone()))
        return real_loss(model, minibatch, policy_version, cfg)

    monkeypatch.setattr(appo, "appo_loss", recording_loss)
    learner.sgd_step(batch)
    halves = [slice(0, 2), slice(2, 4)] * 2
    for (targets, advantages), rows in zip(seen, halves, strict=True):
        torch.testing.assert_close(targets, expected["target"][:, rows])
        torch.testing.assert_close(advantages, expected["advantage"][:, rows])
    # the weights did move: re-evaluating the bootstrap after the steps would give other targets
    assert not torch.allclose(appo.gae_targets(learner.model, batch, 0, cfg)["advantage"], expected["advantage"])


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "rmsprop"])
def test_a_nonfinite_step_is_skipped_leaving_the_weights_and_the_optimizer_alone(tmp_path, optimizer):
    """Every --optimizer trains, and skips a non-finite step: fused Adam's and SGD's found_inf, on
    the CPU as on a GPU, reading nothing back; RMSprop (no fused form in torch) by reading the flag."""
    cfg = small_cfg(train_dir=str(tmp_path), optimizer=optimizer, momentum=0.9, learning_rate=1e-3)
    learner = learner_with_weights(cfg)
    assert type(learner.optimizer).__name__.lower() == optimizer
    good = fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4)
    initial = {name: value.clone() for name, value in learner.model.named_parameters()}
    learner.sgd_step(good)
    assert any(not torch.equal(value, initial[name]) for name, value in learner.model.named_parameters())
    weights = {name: value.clone() for name, value in learner.model.named_parameters()}
    adam = copy.deepcopy(learner.optimizer.state_dict()["state"])
    bad = dict(good, reward=torch.full_like(good["reward"], float("inf")))
    stats = learner.sgd_step(bad)
    assert stats["skipped_steps"] == 1 and not np.isfinite(stats["loss"])
    for name, value in learner.model.named_parameters():
        assert torch.equal(value, weights[name]), name
    for index, moments in learner.optimizer.state_dict()["state"].items():
        for key, value in moments.items():
            assert torch.equal(value, adam[index][key]), (index, key)
    assert learner.sgd_step(good)["skipped_steps"] == 1  # a finite step trains again
    assert any(not torch.equal(value, weights[name]) for name, value in learner.model.named_parameters())


def test_linear_decay_scales_the_learning_rate_by_the_share_of_frames_left(tmp_path):
    cfg = small_cfg(train_dir=str(tmp_path), lr_schedule="linear_decay", learning_rate=1e-3, train_for_env_steps=1000)
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    learner.env_frames = 250
    learner.apply_lr_schedule()
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.75e-3)
    stats = learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))
    assert stats["learning_rate"] == pytest.approx(0.75e-3)  # what TensorBoard's p0/learning_rate shows
    learner.env_frames = 5000  # past the end (a resumed run with a smaller budget): zero, not negative
    learner.apply_lr_schedule()
    assert learner.optimizer.param_groups[0]["lr"] == 0.0


def test_lr_decay_frames_moves_where_linear_decay_reaches_zero(tmp_path):
    cfg = appo.parse_args(["--env", "atari_breakout", "--train_for_env_steps", "1000", "--lr_decay_frames", "4000",
                           "--learning_rate", "1e-3", "--train_dir", str(tmp_path)])
    assert cfg.lr_schedule == "linear_decay"  # the Atari family's
    spaces_pair = (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(4))
    learner = appo.Learner(0, cfg, outside_a_run(cfg, spaces_pair), spaces_pair)
    learner.env_frames = 1000  # the budget's end, a quarter of Sample Factory's horizon at frameskip 4
    learner.apply_lr_schedule()
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.75e-3)
