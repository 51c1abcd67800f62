"""appo.py's ALGO LOGIC: the model: the encoders, the recurrent core over a rollout, the action
distributions, the heads' initialisation and the running normalisers."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
from conftest import (IMAGE_AND_VECTOR, TWO_HEADS, check_bfloat16_encoder, fake_batch, outside_a_run, random_obs,
                      small_cfg)


# ---------------------------------------------------------------------------------------------
# Encoders

def test_convnet_atari_is_the_nature_cnn_with_relu():
    cfg = small_cfg(encoder="convnet_atari", rnn_type="none")
    model = appo.ActorCritic(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(4), cfg)
    convs = [m for m in model.encoders["obs"] if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
    assert model.fc[0].in_features == 64 * 7 * 7  # 84 -> 20 -> 9 -> 7
    assert not any(isinstance(m, torch.nn.ELU) for m in model.modules())
    assert any(isinstance(m, torch.nn.ReLU) for m in model.modules())


def test_resnet_is_the_impala_deep_encoder():
    cfg = small_cfg(encoder="resnet")
    model = appo.ActorCritic(spaces.Box(0, 255, (3, 72, 128), np.uint8), spaces.Discrete(3), cfg)
    encoder = model.encoders["obs"]
    # per stage: conv c_in -> c (3x3), max-pool, 2 residual blocks of 2 convs c -> c (3x3); weights + biases
    stages, expected_parameters, channels = [16, 32, 32], 0, 3
    for c in stages:
        expected_parameters += (channels * c * 9 + c) + 4 * (c * c * 9 + c)
        channels = c
    assert sum(p.numel() for p in encoder.parameters()) == expected_parameters == 97_600
    assert [m.out_channels for m in encoder if isinstance(m, torch.nn.Conv2d)] == stages
    assert sum(isinstance(m, appo.ResidualBlock) for m in encoder) == 6
    assert model.fc[0].in_features == 32 * 9 * 16  # 72x128 halved three times (rounding up)
    logits, values, _ = model({"obs": torch.randint(0, 256, (5, 3, 72, 128), dtype=torch.uint8)},
                              torch.zeros(5, appo.rnn_state_size(cfg)))
    assert logits.shape == (5, 3) and values.shape == (5,) and torch.isfinite(logits).all()


def test_a_residual_block_adds_its_convs_to_its_input():
    block = appo.ResidualBlock(4)
    x = torch.randn(2, 4, 5, 5)
    expected = x + block.conv2(torch.relu(block.conv1(torch.relu(x))))
    torch.testing.assert_close(block(x), expected)
    torch.nn.init.zeros_(block.conv2.weight)
    torch.nn.init.zeros_(block.conv2.bias)
    torch.testing.assert_close(block(x), x)  # the skip path alone


def test_conv_weights_use_the_channels_last_layout_and_give_the_same_outputs():
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, small_cfg())
    conv = model.encoders["obs"][0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    obs, state = random_obs(IMAGE_AND_VECTOR, (3,)), torch.zeros(3, 32)
    logits, values, _ = model(obs, state)
    model.to(memory_format=torch.contiguous_format)
    reference_logits, reference_values, _ = model(obs, state)
    torch.testing.assert_close(logits, reference_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values, reference_values, atol=1e-5, rtol=1e-4)


def test_bfloat16_encoder_is_close_to_float32_and_keeps_float32_weights_and_gradients():
    """--encoder_dtype bfloat16 runs the convs and FC under autocast; what comes out, the weights
    and their gradients are float32 and the features within bf16 rounding of the float32 ones
    (tests/test_cuda.py makes the same check on a GPU)."""
    torch.manual_seed(2)
    model32 = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, small_cfg(encoder_dtype="float32"))
    model16 = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, small_cfg(encoder_dtype="bfloat16"))
    model16.load_state_dict(model32.state_dict())
    check_bfloat16_encoder(model32, model16, random_obs(IMAGE_AND_VECTOR, (16,)))


# ---------------------------------------------------------------------------------------------
# The recurrent core, the heads' initialisation, the critic's own trunk

@pytest.mark.parametrize("rnn_type", ["gru", "lstm", "none"])
def test_rnn_over_a_rollout_equals_stepping_it_with_episode_boundaries(rnn_type):
    torch.manual_seed(0)
    cfg = small_cfg(rnn_type=rnn_type)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    steps, batch = 6, 3
    obs = random_obs(IMAGE_AND_VECTOR, (steps, batch))
    dones = torch.zeros(steps, batch)
    dones[1, 0] = dones[3, 2] = dones[4, 0] = 1.0
    first_state = torch.randn(batch, appo.rnn_state_size(cfg))
    logits, values = model.forward_rollout(obs, first_state, dones)
    state = first_state
    for t in range(steps):
        step_logits, step_values, state = model({k: v[t] for k, v in obs.items()}, state)
        torch.testing.assert_close(step_logits, logits[t])
        torch.testing.assert_close(step_values, values[t])
        state = state * (1 - dones[t]).unsqueeze(1)  # what the rollout worker does on done
    assert logits.shape == (steps, batch, 7) and values.shape == (steps, batch)


@pytest.mark.parametrize("normalize_input", [True, False])
def test_the_model_never_writes_into_the_observations_it_reads(normalize_input):
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, small_cfg(normalize_input=normalize_input))
    obs = random_obs(IMAGE_AND_VECTOR, (4,))
    before = {key: value.clone() for key, value in obs.items()}
    model(obs, torch.zeros(4, appo.rnn_state_size(small_cfg())))
    for key in obs:
        assert torch.equal(obs[key], before[key]), key


def test_the_initial_std_and_the_policy_heads_gain_are_flags_and_their_defaults_keep_todays_init():
    """--initial_stddev (Sample Factory's name) starts a Box head's std there; --policy_head_gain is the
    orthogonal gain of the policy head's weights alone (every singular value equals it); at their
    defaults the model is today's, drawn from the same seed to the bit."""
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    obs_space = spaces.Box(-np.inf, np.inf, (5,), np.float32)
    torch.manual_seed(0)
    model = appo.ActorCritic(obs_space, box, small_cfg(rnn_type="none", initial_stddev=0.6, policy_head_gain=0.01))
    torch.testing.assert_close(model.action_log_std.exp(), torch.full((3,), 0.6))
    torch.testing.assert_close(torch.linalg.svdvals(model.policy_head.weight), torch.full((3,), 0.01))
    torch.testing.assert_close(torch.linalg.svdvals(model.value_head.weight), torch.ones(1))
    torch.manual_seed(0)
    default = appo.ActorCritic(obs_space, box, small_cfg(rnn_type="none"))
    torch.manual_seed(0)
    gain_one = appo.ActorCritic(obs_space, box, small_cfg(rnn_type="none", initial_stddev=1.0, policy_head_gain=1.0))
    assert torch.equal(default.action_log_std, torch.zeros(3))
    for (name, ours), (_, same) in zip(default.state_dict().items(), gain_one.state_dict().items(), strict=True):
        assert torch.equal(ours, same), name
    torch.testing.assert_close(torch.linalg.svdvals(default.policy_head.weight), torch.ones(3))


def test_without_shared_weights_the_value_has_its_own_encoder_and_fc_and_the_policy_none_of_its_gradient(tmp_path):
    """--no-actor_critic_share_weights (Sample Factory's name): the value reads the observations
    through an encoder and FC of its own, so the value loss moves only those and the value head,
    and the policy's logits do not depend on them; the step and the rollout paths agree, and a
    learner trains on it. With a recurrent core it is one line before anything starts."""
    torch.manual_seed(3)
    cfg = small_cfg(train_dir=str(tmp_path), rnn_type="none", actor_critic_share_weights=False)
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    names = [name for name, _ in model.named_parameters()]
    assert any(name.startswith("critic_encoders.obs.") for name in names) and "critic_fc.0.weight" in names
    obs = random_obs(IMAGE_AND_VECTOR, (4, 3))
    logits, values = model.forward_rollout(obs, torch.zeros(3, 1), torch.zeros(4, 3))
    policy_grads = torch.autograd.grad(values.sum(), [p for n, p in model.named_parameters()
                                                      if n.startswith(("encoders", "fc", "policy_head"))],
                                       allow_unused=True)
    assert all(grad is None or not grad.any() for grad in policy_grads)
    critic_grads = torch.autograd.grad(logits.sum(), [p for n, p in model.named_parameters()
                                                      if n.startswith(("critic_", "value_head"))], allow_unused=True)
    assert all(grad is None or not grad.any() for grad in critic_grads)
    step_logits, step_values, _ = model({key: value[1] for key, value in obs.items()}, torch.zeros(3, 1))
    torch.testing.assert_close(step_logits, logits[1])
    torch.testing.assert_close(step_values, values[1])
    learner = appo.Learner(0, cfg, outside_a_run(cfg, (IMAGE_AND_VECTOR, TWO_HEADS)), (IMAGE_AND_VECTOR, TWO_HEADS))
    before = learner.model.critic_fc[0].weight.detach().clone()
    assert learner.sgd_step(fake_batch(IMAGE_AND_VECTOR, TWO_HEADS, cfg, 6, 4))["skipped_steps"] == 0
    assert not torch.equal(learner.model.critic_fc[0].weight, before)
    errors = appo.config_errors(small_cfg(actor_critic_share_weights=False, rnn_type="gru"))
    assert any("--no-actor_critic_share_weights" in error and "--rnn_type none" in error for error in errors)
    assert "actor_critic_share_weights" in appo.MODEL_FLAGS  # a resume or an evaluation keeps it


# ---------------------------------------------------------------------------------------------
# Action distributions

def test_action_heads_sample_valid_actions_and_score_them():
    logits = torch.log(torch.tensor([[0.0, 1.0, 0.0, 0.25, 0.25, 0.25, 0.25]]) + 1e-12)
    heads = appo.Categoricals([3, 4])
    actions = heads.sample(logits.repeat(50, 1))
    assert actions.shape == (50, 2) and (actions[:, 0] == 1).all() and (actions[:, 1] < 4).all()
    log_probs = heads.log_prob(logits, torch.tensor([[1, 2]]))
    assert log_probs.item() == pytest.approx(np.log(0.25), abs=1e-5)
    assert heads.entropy(logits).item() == pytest.approx(np.log(4), abs=1e-4)
    assert heads.mode(logits).tolist() == [[1, 0]]


def test_sampling_draws_exactly_what_torch_multinomial_draws_from_the_same_seed():
    """Categoricals.sample is multinomial's one-sample algorithm without its input checks (two reads
    of the GPU per head): the same actions and the same random numbers used, so seeded runs are
    unchanged (scripts/same_training.py)."""
    heads = appo.Categoricals([3, 4, 2])
    for seed in range(20):
        logits = torch.randn(64, 9, generator=torch.Generator().manual_seed(100 + seed)) * 3
        logits[::7, 1] = -torch.inf  # a masked action
        torch.manual_seed(seed)
        ours, after_ours = heads.sample(logits), torch.rand(1)
        torch.manual_seed(seed)
        theirs = torch.stack([torch.multinomial(log_probs.exp(), 1).squeeze(1)
                              for log_probs in heads.log_softmax(logits)], dim=-1)
        assert torch.equal(ours, theirs), seed
        assert torch.equal(after_ours, torch.rand(1))  # the generator moved on by as much
        assert not (ours[::7, 0] == 1).any()


def test_symmetric_kl_to_uniform_against_a_hand_computed_example():
    # head 1: probabilities (3/4, 1/4) against uniform (1/2, 1/2); head 2: uniform over 3, which adds 0
    logits = torch.log(torch.tensor([[0.75, 0.25, 1 / 3, 1 / 3, 1 / 3]]))
    kl_to_uniform = 0.75 * np.log(0.75 / 0.5) + 0.25 * np.log(0.25 / 0.5)
    kl_from_uniform = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)
    expected = 0.5 * (kl_to_uniform + kl_from_uniform)
    assert appo.Categoricals([2, 3]).symmetric_kl_to_uniform(logits).item() == pytest.approx(expected, rel=1e-5)


def test_the_gaussian_head_scores_and_samples_as_a_diagonal_normal():
    gaussian = appo.DiagonalGaussian(3)
    mean, log_std = torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([[0.0, -1.0, 0.7]])
    logits = torch.cat([mean, log_std], dim=-1)
    actions = torch.tensor([[0.1, -1.2, 5.0]])  # outside a Box's bounds too: scored unclipped
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(gaussian.log_prob(logits, actions), normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(gaussian.entropy(logits), normal.entropy().sum(-1))
    assert torch.equal(gaussian.mode(logits), mean)
    torch.manual_seed(0)
    samples = gaussian.sample(logits.expand(20_000, 6))
    torch.testing.assert_close(samples.mean(0), mean[0], atol=0.05, rtol=0)
    torch.testing.assert_close(samples.std(0), log_std[0].exp(), atol=0.05, rtol=0.02)


def test_a_box_action_space_gets_a_gaussian_with_a_learned_state_independent_log_std():
    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    model = appo.ActorCritic(spaces.Box(-np.inf, np.inf, (5,), np.float32), box, small_cfg(rnn_type="none"))
    logits, _, _ = model({"obs": torch.randn(4, 5)}, torch.zeros(4, 1))
    assert logits.shape == (4, 4) and torch.equal(logits[:, 2:], torch.zeros(4, 2))  # log-std 0 at the start
    model.action_dist.log_prob(logits, torch.zeros(4, 2)).sum().backward()
    assert model.action_log_std.grad is not None and model.action_log_std.grad.abs().sum() > 0
    specs = appo.rollout_buffer_specs(spaces.Box(-np.inf, np.inf, (5,), np.float32), box, small_cfg())
    assert specs["actions"] == ((2,), np.dtype(np.float32))
    clipped = appo.env_action(box, np.array([3.0, -0.5], np.float32))
    assert clipped.tolist() == [1.0, -0.5] and clipped.dtype == np.float32  # bounds only at the env


# ---------------------------------------------------------------------------------------------
# Normalisers

@pytest.mark.parametrize("shape", [(), (3,)])
def test_the_normaliser_weighs_the_rows_it_counts_and_leaves_a_nonfinite_batch_out_whole(shape):
    """The statistics of rows weighed by the mask are those of the rows it selects (torch's own
    mean and variance of them), a NaN in a row left out is ignored, and one in a counted row leaves
    the batch out whole, all without a read back (the count stays a tensor)."""
    torch.manual_seed(0)
    batch, rows = torch.randn(40, *shape) * 3 + 1, (torch.rand(40) < 0.6).float()
    batch[rows == 0] = float("nan")  # left out: must not matter
    normalizer = appo.RunningNormalizer(shape)
    mean, var, n = normalizer.moments(batch, rows)
    assert torch.is_tensor(n) and n.item() == rows.sum().item()
    selected = batch[rows > 0]
    torch.testing.assert_close(mean, selected.mean(0))
    torch.testing.assert_close(var, selected.var(0, correction=0))
    normalizer.update(batch, rows=rows)
    torch.testing.assert_close(normalizer.mean, selected.mean(0) * n / (n + 1e-4))
    poisoned = batch.clone()
    poisoned[int(rows.nonzero()[0])] = float("nan")
    before = {name: getattr(normalizer, name).clone() for name in ("mean", "var", "count")}
    normalizer.update(poisoned, rows=rows)
    for name, value in before.items():
        assert torch.equal(getattr(normalizer, name), value), name
    pixels = torch.randint(0, 256, (16, *shape), dtype=torch.uint8)
    mean, var, n = normalizer.moments(pixels, None)
    assert n.item() == 16
    torch.testing.assert_close(var, pixels.float().var(0, correction=0))


def test_running_normalizer_matches_the_statistics_of_all_batches_seen():
    normalizer = appo.RunningNormalizer((3, 2))
    batches = [torch.randn(n, 3, 2) * 4 + 7 for n in (5, 17, 1, 40)]
    for batch in batches:
        normalizer.update(batch)
    everything = torch.cat(batches)
    torch.testing.assert_close(normalizer.mean, everything.mean(0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(normalizer.var, everything.var(0, unbiased=False), atol=1e-3, rtol=1e-3)
    normalized = normalizer(everything)
    assert normalized.mean().abs() < 1e-3 and (normalized.std() - 1).abs() < 0.05


def test_pixel_statistics_are_taken_in_unit_scale_without_a_float_copy_of_the_batch():
    pixels = torch.randint(0, 256, (64, 3, 4, 5), dtype=torch.uint8)
    from_pixels, from_floats = appo.RunningNormalizer((3, 4, 5)), appo.RunningNormalizer((3, 4, 5))
    from_pixels.update(pixels, scale=1.0 / 255.0)
    from_floats.update(pixels.float() / 255.0)
    torch.testing.assert_close(from_pixels.mean, from_floats.mean)
    torch.testing.assert_close(from_pixels.var, from_floats.var)
    scaled_in_place = pixels.float()
    result = from_pixels(scaled_in_place, scale=1.0 / 255.0, inplace=True)
    assert result.data_ptr() == scaled_in_place.data_ptr()
    torch.testing.assert_close(result, from_floats(pixels.float() / 255.0))


def test_a_nonfinite_float_batch_leaves_the_statistics_alone():
    normalizer = appo.RunningNormalizer((2,))
    normalizer.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    mean, var = normalizer.mean.clone(), normalizer.var.clone()
    normalizer.update(torch.tensor([[float("nan"), 1.0]]))
    assert torch.equal(normalizer.mean, mean) and torch.equal(normalizer.var, var)
