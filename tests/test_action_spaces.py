"""Every standard action space, and action masks: the heads each space becomes, the conversion back
to the env's actions, and short runs on the envs of tests/action_space_envs.py in real processes."""
import argparse
import os
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
from conftest import RUN_TIMEOUT_S, processes_still_tagged

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

MIXED = spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Box(-1.0, 1.0, (2,), np.float32),
                     "buttons": spaces.MultiBinary(2), "grid": spaces.MultiDiscrete([[2, 3]]),
                     "both": spaces.Tuple([spaces.Discrete(2, start=-1), spaces.Box(0.0, 5.0, (2, 2), np.float32)])})


def small_cfg(**overrides) -> argparse.Namespace:
    flags = ["--env", "doom_basic", "--hidden_size", "32", "--encoder_mlp_layers", "16", "--rnn_type", "none"]
    cfg = appo.parse_args(flags)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    return cfg


@pytest.mark.parametrize("action_space, kind, logits, action_shape", [
    (spaces.MultiBinary(4), appo.Categoricals, 8, (4,)),
    (spaces.MultiBinary((2, 3)), appo.Categoricals, 12, (6,)),
    (spaces.Box(-1.0, 1.0, (2, 3), np.float32), appo.DiagonalGaussian, 6, (6,)),
    (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.MultiDiscrete([3, 4])}), appo.Categoricals, 9, (3,)),
    (spaces.Tuple([spaces.Box(-1, 1, (2,)), spaces.Box(-1, 1, (3, 1))]), appo.DiagonalGaussian, 5, (5,)),
    (MIXED, appo.MixedHeads, 2 + 2 * 2 + (2 + 3) + 3 + 2 + 4, (6 + 6,)),  # choices, then means
])
def test_each_space_becomes_its_heads_and_a_sampled_row_is_an_action_of_the_space(action_space, kind, logits,
                                                                                 action_shape):
    dist = appo.action_distribution(action_space)
    assert isinstance(dist, kind) and dist.num_outputs == logits and dist.action_shape == action_shape
    params = torch.randn(64, dist.num_outputs + dist.num_log_stds)
    actions = dist.sample(params)
    assert actions.shape == (64, *action_shape)
    assert actions.dtype == torch.from_numpy(np.zeros(1, dist.action_dtype)).dtype  # the slot field's
    assert dist.log_prob(params, actions).shape == (64,) and dist.entropy(params).shape == (64,)
    for row in actions.numpy():
        assert action_space.contains(appo.env_action(action_space, row))


def test_mixed_heads_score_and_entropy_are_the_sums_of_their_parts():
    dist = appo.action_distribution(spaces.Dict({"move": spaces.Discrete(3),
                                                 "aim": spaces.Box(-1.0, 1.0, (2,), np.float32)}))
    logits, mean, log_std = torch.randn(5, 3), torch.randn(5, 2), torch.randn(5, 2)
    params = torch.cat([logits, mean, log_std], dim=-1)
    actions = dist.sample(params)
    categorical = torch.distributions.Categorical(logits=logits)
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = categorical.log_prob(actions[:, 0].long()) + normal.log_prob(actions[:, 1:]).sum(-1)
    torch.testing.assert_close(dist.log_prob(params, actions), expected)
    torch.testing.assert_close(dist.entropy(params), categorical.entropy() + normal.entropy().sum(-1))
    assert dist.mode(params)[:, 0].tolist() == logits.argmax(-1).float().tolist()


def test_a_mixed_row_goes_to_each_part_in_order_shaped_offset_and_clipped():
    # the Dict lists its keys sorted: aim, both, buttons, grid, move. A row is the choices of both[0],
    # buttons, grid and move, then the values of aim and both[1]
    row = np.array([1, 0, 1, 1, 2, 2, 0.5, -3.0, 9.0, 0.0, 1.0, 2.0], np.float32)
    action = appo.env_action(MIXED, row)
    assert action["both"][0] == 0 and action["buttons"].tolist() == [0, 1] and action["grid"].tolist() == [[1, 2]]
    assert action["move"] == 2 and action["buttons"].dtype == np.int8
    assert action["aim"].tolist() == [0.5, -1.0] and action["both"][1].tolist() == [[5.0, 0.0], [1.0, 2.0]]
    assert MIXED.contains(action)
    assert appo.env_action(spaces.Discrete(3, start=-1), np.array([0])) == -1


MASKED_OBS = spaces.Dict({"obs": spaces.Box(-1.0, 1.0, (3,), np.float32),
                          "action_mask": spaces.Box(0, 1, (6,), np.int8)})
MASKED_ACTIONS = spaces.Tuple([spaces.Discrete(4), spaces.Discrete(2)])


def masked_model() -> appo.ActorCritic:
    torch.manual_seed(0)
    return appo.ActorCritic(MASKED_OBS, MASKED_ACTIONS, small_cfg())


def test_a_masked_action_is_never_sampled_nor_the_mode_and_costs_no_nan():
    model = masked_model()
    mask = torch.tensor([[0, 1, 0, 1, 1, 0]] * 4000, dtype=torch.int8)
    obs = {"obs": torch.randn(4000, 3), "action_mask": mask}
    logits, _, _ = model(obs, torch.zeros(4000, 1))
    actions = model.action_dist.sample(logits)
    assert set(actions[:, 0].tolist()) == {1, 3} and set(actions[:, 1].tolist()) == {0}
    assert set(model.action_dist.mode(logits)[:, 0].tolist()) <= {1, 3}
    assert torch.isfinite(model.action_dist.entropy(logits)).all()
    assert torch.isfinite(model.action_dist.log_prob(logits, torch.zeros_like(actions))).all()  # forbidden, finite


def test_the_learner_masks_the_stored_observation_as_acting_did():
    """The log-probs that forward_rollout gives the loss are those act() recorded: without the
    mask in the loss, the forbidden actions' probability would dilute every allowed one's."""
    model, steps, batch = masked_model(), 5, 3
    mask = torch.randint(0, 2, (steps, batch, 6), dtype=torch.int8)
    mask[..., 0] = mask[..., 4] = 1  # each head keeps an allowed action
    obs = {"obs": torch.randn(steps, batch, 3), "action_mask": mask}
    outputs, _ = appo.act(model, {key: value.flatten(0, 1) for key, value in obs.items()}, torch.zeros(steps * batch, 1))
    actions, log_probs = outputs["actions"], outputs["log_prob"]
    with torch.no_grad():
        logits, _ = model.forward_rollout(obs, torch.zeros(batch, 1), torch.zeros(steps, batch))
        relearned = model.action_dist.log_prob(logits, actions.view(steps, batch, 2))
    torch.testing.assert_close(relearned, log_probs.view(steps, batch))


def test_the_mask_is_no_input_feature():
    model = masked_model()
    obs = {"obs": torch.randn(2, 3), "action_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 1, 0]])}
    logits, values, _ = model(obs, torch.zeros(2, 1))
    same_obs = {"obs": obs["obs"], "action_mask": torch.ones(2, 6, dtype=torch.int64)}
    unmasked_logits, unmasked_values, _ = model(same_obs, torch.zeros(2, 1))
    torch.testing.assert_close(values, unmasked_values)
    torch.testing.assert_close(logits[0], unmasked_logits[0])
    assert "action_mask" not in model.obs_normalizers and not list(model.encoders["action_mask"].parameters())


def test_a_gym_envs_multibinary_mask_reaches_the_model_as_a_vector_that_masks():
    import gymnasium as gym
    import env as envs

    class Pick(gym.Env):
        action_space = spaces.Discrete(4)
        observation_space = spaces.Dict({"cells": spaces.Box(0.0, 1.0, (4,), np.float32),
                                         "action_mask": spaces.MultiBinary(4)})

    wrapped = envs.GymObservations(Pick())
    assert wrapped.observation_space["action_mask"] == spaces.Box(0.0, 1.0, (4,), np.float32)
    mask = wrapped.observation({"cells": np.zeros(4, np.float32), "action_mask": np.array([0, 0, 1, 0], np.int8)})
    model = appo.ActorCritic(wrapped.observation_space, Pick.action_space, small_cfg())
    obs = {key: torch.as_tensor(value).expand(100, -1) for key, value in mask.items()}
    assert model.action_dist.sample(model(obs, torch.zeros(100, 1))[0]).unique().tolist() == [2]


def test_masks_that_cannot_mask_are_named_with_their_fix():
    wrong = spaces.Dict({"obs": spaces.Box(-1, 1, (3,)), "action_mask": spaces.Box(0, 1, (5,), np.int8)})
    assert "make the mask a vector of 6" in appo.action_mask_error(wrong, MASKED_ACTIONS)
    with pytest.raises(ValueError, match="make the mask a vector of 6"):
        appo.ActorCritic(wrong, MASKED_ACTIONS, small_cfg())
    assert "has none" in appo.action_mask_error(MASKED_OBS, spaces.Box(-1, 1, (2,)))
    assert appo.action_mask_error(MASKED_OBS, MASKED_ACTIONS) is None


def test_a_wrong_size_mask_is_one_line_before_any_process_starts(tmp_path, capsys):
    code = appo.main(["--env", "gym:action_space_envs:Spaces/WrongSizeMask-v0", "--train_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "gym_action_space_envs_Spaces_WrongSizeMask-v0" / "checkpoint_p0").exists()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "has shape (5,)" in errors[0] and "make the mask a vector of 6" in errors[0], err


def test_symmetric_kl_with_a_mask_is_refused_naming_the_entropy():
    cfg = small_cfg(env="gym:masked", exploration_loss="symmetric_kl", async_rl=True, past_opponents_fraction=0.0)
    probe = appo.EnvProbe((MASKED_OBS, MASKED_ACTIONS), 1, None)
    groups = appo.agent_groups(cfg, probe.agent_spaces, probe.agent_names)
    assert any("use --exploration_loss entropy" in error for error in appo.probe_errors(cfg, probe, *groups))
    cfg.exploration_loss = "entropy"
    assert appo.probe_errors(cfg, probe, *groups) == []


def run_appo(tmp_path, env_id: str, *flags: str) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    result = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), "--env", f"gym:action_space_envs:{env_id}",
                             "--train_dir", str(tmp_path), "--experiment", "e", *flags],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
                            env=dict(os.environ, APPO_TEST_TAG=tag,
                                     PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])))
    assert processes_still_tagged(tag) == []
    return result


SHORT_RUN = ["--num_workers", "1", "--num_envs_per_worker", "4", "--rollout", "16", "--batch_size", "64",
             "--hidden_size", "32", "--train_for_env_steps", "2048", "--report_every_sec", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["Spaces/Bits-v0", "Spaces/Plane-v0", "Spaces/Mixed-v0", "Spaces/Masked-v0"])
def test_each_action_space_trains_and_plays_in_real_processes_with_only_actions_the_env_takes(tmp_path, env_id):
    """The envs raise on an action outside their space (Masked-v0: one its mask forbids); the
    rollout worker would report it as a failed env. Mixed-v0 also observes an image and a vector."""
    result = run_appo(tmp_path, env_id, *SHORT_RUN)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and re.search(r"^done: [\d,]+ frames trained", result.stdout, re.MULTILINE), \
        output[-3000:]
    assert "failed (" not in output, output[-3000:]
    played = run_appo(tmp_path, env_id, "--mode", "eval", "--max_num_episodes", "3")
    assert played.returncode == 0 and "mean return" in played.stdout, (played.stdout + played.stderr)[-3000:]
