"""Population-based training: the ranking, mutation and replacement rules on synthetic populations,
the learner taking over weights and hyperparameters, and a real run with three policies (in one
process: --serial_mode)."""
import glob
import json
import os
import random
import subprocess
import sys
import types
import uuid

import numpy as np
import pytest
import torch
from gymnasium import spaces

import appo
import env as envs
from conftest import RUN_TIMEOUT_S, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pbt_cfg(**overrides):
    cfg = appo.parse_args(["--env", "doom_basic", "--num_policies", "5", "--with_pbt", "--hidden_size", "32",
                           "--rollout", "4", "--batch_size", "8"])
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


ROW = {"learning_rate": 1e-4, "exploration_loss_coeff": 0.003, "adam_beta1": 0.9, "reward/frag": 1.0, "reward/death": -0.5}


def test_best_and_worst_are_the_top_and_bottom_fraction():
    best, worst = appo.pbt_best_and_worst([0.9, 0.1, 0.5, 0.8, 0.2, 0.3, 0.4, 0.6, 0.7, 0.0], 0.3)
    assert best == [0, 3, 8] and worst == [4, 1, 9]
    assert appo.pbt_best_and_worst([0.2, 0.7], 0.3) == ([1], [0])  # one each, however small the population


def test_mutation_multiplies_or_divides_by_the_factor_and_keeps_beta1_below_one():
    rng = random.Random(0)
    row, changes = appo.pbt_mutate(ROW, rng, rate=1.0, factor=1.2)
    assert set(changes) == set(ROW)
    for name in ROW:
        if name != "adam_beta1":
            assert row[name] / ROW[name] == pytest.approx(1.2) or row[name] / ROW[name] == pytest.approx(1 / 1.2)
    assert (1 - row["adam_beta1"]) / 0.1 in (pytest.approx(1.2), pytest.approx(1 / 1.2))
    beta1_row = dict(ROW)
    for _ in range(200):
        beta1_row, _ = appo.pbt_mutate(beta1_row, rng, rate=1.0, factor=1.2)
        assert 0 < beta1_row["adam_beta1"] < 1
    assert appo.pbt_mutate(ROW, rng, rate=0.0, factor=1.2) == (ROW, {})


def test_mutation_rate_is_the_chance_per_hyperparameter():
    rng = random.Random(1)
    changed = sum(len(appo.pbt_mutate(ROW, rng, rate=0.15, factor=1.2)[1]) for _ in range(2000))
    assert changed / (2000 * len(ROW)) == pytest.approx(0.15, abs=0.02)


def test_round_replaces_the_worst_with_the_best_and_mutates_everyone_but_the_best():
    cfg = pbt_cfg(pbt_replace_fraction=0.4, pbt_replace_reward_gap=0.35, pbt_mutation_rate=1.0)
    rows = [dict(ROW, learning_rate=(i + 1) * 1e-4) for i in range(5)]
    objectives = [0.9, 0.1, 0.5, 0.8, 0.2]  # best: 0 and 3; worst: 4 and 1
    new_rows, events = appo.pbt_round(objectives, rows, random.Random(2), cfg)
    replaced = {e["policy_id"]: e["source"] for e in events if e["event"] == "replaced"}
    mutated = {e["policy_id"] for e in events if e["event"] == "mutated"}
    assert set(replaced) == {1, 4} and set(replaced.values()) <= {0, 3}
    assert mutated == {1, 2, 4}  # everyone outside the best, the replaced ones after their copy
    assert new_rows[0] == rows[0] and new_rows[3] == rows[3]
    for policy_id, source in replaced.items():  # the copy was then mutated by exactly the factor
        ratio = new_rows[policy_id]["learning_rate"] / rows[source]["learning_rate"]
        assert ratio == pytest.approx(1.2) or ratio == pytest.approx(1 / 1.2)


def test_round_keeps_a_worst_policy_whose_objective_is_close_to_the_best():
    cfg = pbt_cfg(pbt_replace_fraction=0.3, pbt_replace_reward_gap=0.35, pbt_mutation_rate=0.0)
    rows = [dict(ROW, learning_rate=(i + 1) * 1e-4) for i in range(3)]
    new_rows, events = appo.pbt_round([0.6, 0.5, 0.4], rows, random.Random(3), cfg)  # gap 0.2 < 0.35
    assert events == [] and new_rows == rows
    _, events = appo.pbt_round([0.9, 0.5, 0.4], rows, random.Random(3), cfg)  # gap 0.5
    assert [(e["event"], e["policy_id"], e["source"]) for e in events] == [("replaced", 2, 0)]


def test_hyperparams_are_shared_between_processes(processes):
    cfg = pbt_cfg(num_policies=2)
    hyperparams = appo.PolicyHyperparams(cfg, {"frag": 1.0, "death": -0.5})
    assert hyperparams.names == ["learning_rate", "exploration_loss_coeff", "adam_beta1", "reward/frag", "reward/death"]
    assert hyperparams.row(1) == {"learning_rate": cfg.learning_rate, "exploration_loss_coeff": cfg.exploration_loss_coeff,
                                  "adam_beta1": cfg.adam_beta1, "reward/frag": 1.0, "reward/death": -0.5}
    process = processes.Process(target=double_frag_weight, args=(hyperparams, 1))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0
    assert hyperparams.reward_shaping(1) == {"frag": 2.0, "death": -0.5}
    assert hyperparams.version.tolist() == [0, 1]  # readers see that policy 1's row moved


def double_frag_weight(hyperparams, policy_id):
    row = hyperparams.row(policy_id)
    row["reward/frag"] *= 2
    hyperparams.set_row(policy_id, row)


def test_learner_takes_over_the_weights_and_hyperparameters_it_is_given(tmp_path):
    cfg = pbt_cfg(num_policies=2, train_dir=str(tmp_path))
    obs_space = spaces.Box(0, 255, (3, 36, 64), np.uint8)
    spaces_pair = (obs_space, spaces.Discrete(3))
    model = appo.ActorCritic(*spaces_pair, cfg)
    best = appo.ActorCritic(*spaces_pair, cfg)
    for parameter in best.parameters():
        parameter.data.normal_()
    shared = types.SimpleNamespace(weights=[appo.SharedWeights(best), appo.SharedWeights(model)],
                                   hyperparams=appo.PolicyHyperparams(cfg, None))
    learner = appo.Learner(1, cfg, shared, spaces_pair)
    learner.optimizer.state[next(learner.model.parameters())]["step"] = torch.tensor(5.0)
    shared.hyperparams.request_copy(1, source_policy=0)
    shared.hyperparams.set_row(1, {"learning_rate": 0.5, "exploration_loss_coeff": 0.25, "adam_beta1": 0.8})
    appo.follow_population(learner)
    for name, parameter in learner.model.state_dict().items():
        assert torch.equal(parameter, best.state_dict()[name]), name
    assert not learner.optimizer.state  # Adam starts afresh on the copied weights
    group = learner.optimizer.param_groups[0]
    assert group["lr"] == 0.5 and group["betas"] == (0.8, cfg.adam_beta2)
    assert learner.cfg.exploration_loss_coeff == 0.25 and cfg.exploration_loss_coeff == 0.001  # the learner's copy only


def run_population(tmp_path, tag, frames):
    """A population of 3 until each policy trained `frames` (frames, not seconds: a loaded machine
    slows a run down without making it train less). In --serial_mode, the same learners, workers and
    population code in one process: what is tested is the population, and a run's processes are
    tested elsewhere; eight of them started twice made this one of the suite's slowest tests."""
    command = [sys.executable, os.path.join(REPO, "appo.py"), "--env", "doom_basic", "--num_policies", "3",
               "--with_pbt", "--pbt_period_env_steps", "1500", "--pbt_replace_reward_gap", "0",
               "--pbt_mutation_rate", "1", "--remap_policies_every", "1", "--num_workers", "2",
               "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64", "--hidden_size", "64",
               "--learner_threads", "1", "--train_for_env_steps", str(frames), "--report_every_sec", "2",
               "--train_dir", str(tmp_path), "--experiment", "pbt", "--seed", "3", "--serial_mode"]
    environment = dict(os.environ, APPO_TEST_TAG=tag)
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment, cwd=tmp_path)


def pbt_files(tmp_path):
    paths = sorted(glob.glob(str(tmp_path / "pbt" / "checkpoint_p*" / "pbt.json")))
    states = []
    for path in paths:
        with open(path) as f:
            states.append(json.load(f))
    return states


@pytest.mark.slow
def test_population_run_mutates_replaces_and_resumes(tmp_path):
    tag = uuid.uuid4().hex
    first = run_population(tmp_path, tag, frames=3000)  # two rounds of 1500 frames a policy
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "pbt: round at" in first.stdout, first.stdout[-3000:]
    assert "takes the weights and hyperparameters of policy" in first.stdout
    assert "now trains a copy of policy" in first.stdout  # the learner carried the copy out
    assert " mutates " in first.stdout
    states = pbt_files(tmp_path)
    assert len(states) == 3
    events = [event["event"] for state in states for event in state["history"]]
    assert "replaced" in events and "mutated" in events
    mutated = [state for state in states if any(e["event"] == "mutated" for e in state["history"])]
    assert any(state["hyperparameters"] != {"learning_rate": 1e-4, "exploration_loss_coeff": 0.001, "adam_beta1": 0.9}
               for state in mutated)
    assert processes_still_tagged(tag) == []

    second = run_population(tmp_path, tag, frames=4500)  # resumed at 3000: one more round
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for policy_id, state in enumerate(states):
        assert f"pbt: policy {policy_id} resumes with" in second.stdout
        resumed = pbt_files(tmp_path)[policy_id]
        assert resumed["history"][:len(state["history"])] == state["history"]
    assert processes_still_tagged(tag) == []


def test_an_actor_handed_to_another_policy_sends_its_partial_slot_to_the_old_learner(tmp_path):
    cfg = appo.parse_args(["--env", "doom_basic", "--num_policies", "2", "--num_workers", "1",
                           "--num_envs_per_worker", "1", "--worker_num_splits", "1", "--rollout", "8",
                           "--batch_size", "16", "--hidden_size", "32", "--train_dir", str(tmp_path)])
    probe = appo.probe_env(cfg)
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    worker = appo.RolloutWorker(0, 0, cfg, shared)
    try:
        assert worker.reset_all()
        actor = worker.actors[0]
        old_policy, new_policy = actor.policy_id, 1 - actor.policy_id
        old_slot, arrays = actor.slot, actor.fields.arrays
        for step in range(3):  # three steps of an episode that ended on the third
            arrays["actions"][old_slot, step] = 1
            arrays["policy_version"][old_slot, step] = 7
            worker.record_step(actor, arrays["obs"][old_slot, step], 1.0, step == 2, False, {})
        arrays["actions"][old_slot, 3:] = 99  # stale data from the slot's last use
        assert worker.hand_over(actor, new_policy)
        assert actor.policy_id == new_policy and actor.step == 0 and actor.slot != old_slot
        handed_off = shared.learner_queues[old_policy].get(timeout=1)
        assert handed_off == (old_slot, shared.slots.control.generation(old_slot), 0)
        assert shared.learner_queues[new_policy].qsize() == 0
        assert arrays["valid"][old_slot].tolist() == [1.0] * 3 + [0.0] * 6
        assert (arrays["done"][old_slot, 2:] == 1).all() and (arrays["actions"][old_slot, 3:] == 0).all()
        assert (arrays["policy_version"][old_slot, 3:] == 7).all()
        assert np.array_equal(arrays["obs"][actor.slot, 0], arrays["obs"][old_slot, 3])  # continues from there
        assert (arrays["rnn_state"][actor.slot, 0] == 0).all()  # a new episode
        assert shared.slots.control.owner(old_slot) == 0  # the worker's until the old learner takes it
        slot, generation, worker_id = handed_off
        assert shared.slots.control.transfer(slot, worker_id, generation, appo.learner_owner(cfg, old_policy))
    finally:
        worker.close()


def test_rollout_workers_give_each_agent_its_policys_reward_shaping(tmp_path):
    cfg = appo.parse_args(["--env", "doom_duel_bots", "--num_policies", "2", "--num_workers", "1",
                           "--num_envs_per_worker", "1", "--worker_num_splits", "1", "--rollout", "8",
                           "--batch_size", "16", "--hidden_size", "32", "--train_dir", str(tmp_path)])
    probe = appo.probe_env(cfg)
    assert probe.reward_shaping and probe.reward_shaping["frag"] == 1.0
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    worker = appo.RolloutWorker(0, 0, cfg, shared)
    try:
        actor = worker.actors[0]
        env = worker.envs[actor.env_id]
        row = shared.hyperparams.row(actor.policy_id)
        assert envs.reward_shaping_weights(env) == probe.reward_shaping
        row["reward/frag"], row["reward/death"] = 3.0, -2.0  # what a PBT mutation does
        shared.hyperparams.set_row(actor.policy_id, row)
        worker.apply_reward_shaping(actor)
        assert envs.reward_shaping_weights(env) == dict(probe.reward_shaping, frag=3.0, death=-2.0)
        other_policy = 1 - actor.policy_id  # handed over: the env takes the other policy's weights
        assert worker.hand_over(actor, other_policy)
        worker.apply_reward_shaping(actor)
        assert envs.reward_shaping_weights(env) == probe.reward_shaping
    finally:
        worker.close()
