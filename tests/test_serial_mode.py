"""--serial_mode: the whole run in the calling process, for a debugger; with --seed, repeatable."""
import glob
import multiprocessing
import os
import subprocess
import sys
import uuid

import numpy as np
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


def exact_kl(action_dist, behaviour: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """KL(behaviour || current) per step, from two policies' parameters ("logits")."""
    if isinstance(action_dist, appo.DiagonalGaussian):
        (mean_b, log_std_b), (mean_c, log_std_c) = action_dist.split(behaviour), action_dist.split(current)
        return (log_std_c - log_std_b - 0.5
                + (torch.exp(2 * log_std_b) + (mean_b - mean_c) ** 2) / (2 * torch.exp(2 * log_std_c))).sum(-1)
    return sum((b.exp() * (b - c)).sum(-1)
               for b, c in zip(action_dist.log_softmax(behaviour), action_dist.log_softmax(current)))


@pytest.mark.slow
@pytest.mark.parametrize("env", ["doom_basic", "gym:InvertedPendulum-v5"])  # Discrete, Box
def test_one_more_per_step_quantity_reaches_the_loss_through_act_and_acting_fields(tmp_path, monkeypatch, env):
    """docs/fork.md's seam for a forker's per-step quantity: the behaviour policy's parameters (for
    an exact KL penalty) added to acting_fields, action_dist.num_params wide, and to act()'s dict
    are written by the policy worker into a slot field of their own and reach the loss as
    steps_of(batch)["logits"], [T, B, num_params], on discrete and continuous actions. The loss adds
    the exact KL to the current policy; at a policy version's first SGD step (no weights moved yet,
    no input statistics to update) the steps those weights acted have a KL of 0."""
    real_fields, real_loss = appo.acting_fields, appo.appo_loss

    def fields_with_logits(action_dist):
        return {**real_fields(action_dist), "logits": ((action_dist.num_params,), np.dtype(np.float32))}

    def act_with_logits(model, obs, rnn_state):
        with torch.inference_mode():
            logits, values, next_state = model(obs, rnn_state)
            actions = model.action_dist.sample(logits)
            return {"actions": actions, "log_prob": model.action_dist.log_prob(logits, actions), "value": values,
                    "logits": logits}, next_state

    compared, versions_seen = [], set()

    def loss_with_a_kl_penalty(model, batch, policy_version, cfg):
        loss, aux = real_loss(model, batch, policy_version, cfg)
        steps = appo.steps_of(batch)
        logits, _ = model.forward_rollout({key: batch[key] for key in model.encoders}, batch["rnn_state"][0],
                                          batch["done"])
        kl = exact_kl(model.action_dist, steps["logits"], logits[:-1])
        # the weights that acted a step are the learner's of that version until its first step (version 0
        # too: the learner starts from the weights the runner published as version 0)
        acted_by_these = (steps["valid"] > 0) & (steps["policy_version"] == policy_version)
        if policy_version not in versions_seen and acted_by_these.any():
            assert kl.detach()[acted_by_these].abs().max() < 1e-4, policy_version
            compared.append((policy_version, int(acted_by_these.sum())))
        versions_seen.add(policy_version)
        penalty = appo.masked_mean(kl, aux["mask"])
        return loss + 0.1 * penalty, {**aux, "exact_kl": penalty.detach()}

    monkeypatch.setattr(appo, "acting_fields", fields_with_logits)
    monkeypatch.setattr(appo, "act", act_with_logits)
    monkeypatch.setattr(appo, "appo_loss", loss_with_a_kl_penalty)
    flags = serial_flags(tmp_path, "logits", frames=3_000)
    flags[flags.index("--env") + 1] = env
    # without input normalisation: the learner would update its statistics before the loss
    assert appo.main(flags + ["--no-async_rl", "--no-normalize_input"]) == 0
    assert len(compared) >= 3 and sum(count for _, count in compared) > 100, compared
    assert compared[0][0] == 0, compared


def test_an_acting_field_of_the_wrong_width_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    """docs/fork.md's seam copied with the width of the means alone on a Box env: one line naming the
    field and both shapes, before any process is spawned."""
    real_fields, real_act = appo.acting_fields, appo.act
    monkeypatch.setattr(appo, "acting_fields", lambda action_dist: {
        **real_fields(action_dist), "logits": ((action_dist.num_outputs,), np.dtype(np.float32))})

    def act_with_logits(model, obs, rnn_state):
        outputs, next_state = real_act(model, obs, rnn_state)
        return {**outputs, "logits": model(obs, rnn_state)[0]}, next_state

    monkeypatch.setattr(appo, "act", act_with_logits)
    flags = serial_flags(tmp_path, "narrow", frames=1_000)
    flags[flags.index("--env") + 1] = "gym:InvertedPendulum-v5"
    assert appo.main(flags) == 2
    assert "act() gives 'logits' of shape (2,) a step, acting_fields (1,)" in capsys.readouterr().err


@pytest.mark.slow
def test_every_model_of_a_run_and_its_evaluation_is_made_by_make_model(tmp_path, monkeypatch):
    """The model hook: a fork that returns a model of its own from make_model (here one with a buffer
    more) gets it at every site, or the runner's checks, the learner, the policy worker's loading of
    the published weights and evaluation's loading of the checkpoint would not agree on its keys."""
    made = []

    def make_model(obs_space, action_space, cfg):
        model = appo.ActorCritic(obs_space, action_space, cfg)
        model.register_buffer("fork_marker", torch.tensor(7.0))
        made.append(model)
        return model

    monkeypatch.setattr(appo, "make_model", make_model)
    flags = ["--env", "gym:CartPole-v1", "--train_dir", str(tmp_path), "--experiment", "hook", "--seed", "1"]
    assert appo.main([*flags, "--serial_mode", "--num_workers", "1", "--train_for_env_steps", "2048"]) == 0
    assert len(made) >= 3  # the runner's check, the learner, the policy worker
    path = sorted(glob.glob(str(tmp_path / "hook" / "checkpoint_p0" / "checkpoint_*.pth")))[-1]
    assert float(torch.load(path, weights_only=True)["model"]["fork_marker"]) == 7.0
    made.clear()
    assert appo.main(["--mode", "eval", *flags, "--max_num_episodes", "1"]) == 0
    assert len(made) == 1


class WithPredictor(appo.ActorCritic):
    """A fork's model with a part the learner alone uses (an RND predictor, say), named learner_only."""
    learner_only = ("predictor",)

    def __init__(self, obs_space, action_space, cfg):
        super().__init__(obs_space, action_space, cfg)
        self.predictor = torch.nn.Linear(4, 256)


def test_a_models_learner_only_part_is_never_published_to_the_policy_workers():
    """SharedWeights carries the acting part of the state alone: its size leaves out the predictor's
    4 x 256 + 256 floats, a learner's publish reaches every acting tensor of a policy worker's model,
    and that model's predictor keeps its own values."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1"])
    spaces_pair = appo.probe_env(cfg).spaces
    torch.manual_seed(0)
    learner, worker = WithPredictor(*spaces_pair, cfg), WithPredictor(*spaces_pair, cfg)
    everything = sum(tensor.numel() for tensor in learner.state_dict().values())
    weights = appo.SharedWeights(learner)
    assert weights.num_params == everything - (4 * 256 + 256)
    with torch.no_grad():
        for tensor in learner.state_dict().values():
            tensor.add_(1.0)  # a learner's step, everywhere
    weights.publish(learner, version=3)
    predictor_before = {key: tensor.clone() for key, tensor in worker.predictor.state_dict().items()}
    assert weights.load_into(worker) == 3
    for key, tensor in worker.state_dict().items():
        if key.startswith("predictor."):
            assert torch.equal(tensor, predictor_before[key.removeprefix("predictor.")]), key
        else:
            assert torch.equal(tensor, learner.state_dict()[key]), key


def constrained_run(tmp_path, monkeypatch, experiment: str, cost_coeff: float) -> tuple[float, list]:
    """docs/fork.md's recipe, a per-step value from the env: the cost the env reports in its info is
    named in env_fields, and the targets run on reward - cost_coeff x cost. Returns the run's final
    100-game average (of the true return, the score alone) and the costs the batches held."""
    real_fields, real_targets = appo.env_fields, appo.gae_targets
    costs = []

    def fields_with_cost(cfg):
        return {**real_fields(cfg), "cost": ((), np.dtype(np.float32))}

    def targets_with_cost(model, batch, policy_version, cfg):
        steps = appo.steps_of(batch)
        costs.append((steps["cost"][steps["valid"] > 0].clone(), steps["reward"][steps["valid"] > 0].clone()))
        return real_targets(model, {**batch, "reward": batch["reward"] - cost_coeff * batch["cost"]}, policy_version, cfg)

    monkeypatch.setattr(appo, "env_fields", fields_with_cost)
    monkeypatch.setattr(appo, "gae_targets", targets_with_cost)
    cfg = appo.parse_args(["--env", "gym:costly_env:Costly-v0", "--serial_mode", "--num_workers", "1", "--seed", "1",
                           "--train_for_env_steps", "30000", "--train_dir", str(tmp_path), "--experiment", experiment])
    assert appo.flag_errors(cfg) == []
    result = appo.train(cfg)
    assert result.exit_code == 0
    return result.average_returns[0], costs


@pytest.mark.slow
def test_a_per_step_value_from_the_envs_info_reaches_the_loss_through_env_fields(tmp_path, monkeypatch):
    """The env's info["cost"] becomes the batch's "cost" beside "reward", step for step (a costly step
    scores 1, a free one 0.5), and a loss that charges it trains a different policy: near the free
    action's 10 a game where the same run without the charge goes for the costly 20."""
    unconstrained, _ = constrained_run(tmp_path, monkeypatch, "free", cost_coeff=0.0)
    constrained, costs = constrained_run(tmp_path, monkeypatch, "charged", cost_coeff=1.0)
    cost, reward = torch.cat([c for c, _ in costs]), torch.cat([r for _, r in costs])
    assert cost.numel() > 1000 and set(cost.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(cost, (reward == 1.0).float())  # each step's own cost, beside its own reward
    assert unconstrained > 17 and constrained < 13, (unconstrained, constrained)
