"""Groups of agents: agents whose (observation, action) spaces differ are trained by policies of
their own, each with its model, slots' fields, learner and checkpoint. The env is tests/pz_envs.py's
UnequalSpaces: agents a and b see 5 values, c sees 6 (one always 1) and leaves the game early."""
import glob
import os
import re
import sys
import types

import numpy as np
import pytest
import torch

import appo
import env as envs
import pz_envs
from test_pettingzoo import run_appo
from conftest import free_handed_slots

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "bench"), os.path.join(REPO, "scripts", "tools")]
import bench_groups  # noqa: E402
import random_play  # noqa: E402

UNEQUAL = "pz:pz_envs:unequal_spaces"
SERIAL = ["--serial_mode", "--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8",
          "--batch_size", "16", "--seed", "3"]


def probe_and_groups(*flags: str):
    cfg = appo.parse_args(["--env", UNEQUAL, *flags])
    probe = appo.probe_env(cfg)
    return cfg, probe, appo.agent_groups(cfg, probe.agent_spaces, probe.agent_names)


def test_agents_with_the_same_spaces_form_a_group_and_each_policy_serves_one():
    cfg, probe, (groups, errors) = probe_and_groups()
    assert errors == [] and cfg.num_policies == 2 and cfg.async_rl  # the family's defaults for two groups
    assert groups.of_agent == [0, 0, 1] and groups.of_policy == [0, 1]
    assert [obs["observation"].shape for obs, _ in groups.spaces] == [(5,), (6,)]
    _, _, (groups, _) = probe_and_groups("--num_policies", "4")
    assert groups.of_policy == [0, 1, 0, 1] and groups.policies(0, types.SimpleNamespace(num_policies=4)) == [0, 2]
    _, _, (groups, errors) = probe_and_groups("--agent_policies", "c=0,a=1,b=1")
    assert errors == [] and groups.of_policy == [1, 0]
    assert envs.env_defaults("pz:pz_envs:masked_and_leaving").get("num_policies") is None  # one group: as before


@pytest.mark.parametrize("flags, line", [
    (["--num_policies", "1"], "agents form 2 groups with different spaces (a, b: Dict("),
    (["--agent_policies", "*=0,c=1", "--num_policies", "2"], "agent c is given policies 0 and 1"),
    (["--agent_policies", "a=0,b=1,c=1"], "puts agents with different spaces in policy 1"),
    (["--agent_policies", "a=0,b=0,c=0"], "puts agents with different spaces in policy 0"),
    (["--agent_policies", "a=0,b=0,c=1", "--num_policies", "3"], "gives policy 2 no agent"),
    (["--past_opponents_fraction", "0.5"], "--past_opponents_fraction is for agents of one group"),
    (["--with_pbt"], "groups have 1/1 policies: use --num_policies 4"),
    (["--no-async_rl"], "--no-async_rl is for one policy"),  # each group's learner takes its own batches
])
def test_a_mapping_or_flag_that_mixes_groups_is_refused_before_anything_starts(tmp_path, capsys, flags, line):
    assert appo.main(["--env", UNEQUAL, "--train_dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert line in err, err
    assert not os.path.exists(os.path.join(tmp_path, "default_experiment", "config.json"))


def test_groups_share_the_slot_fields_they_declare_alike_and_keep_their_own_apart():
    cfg = appo.parse_args(["--env", UNEQUAL, "--rollout", "4"])
    _, _, (groups, _) = probe_and_groups()
    specs = [appo.rollout_buffer_specs(*pair, cfg) for pair in groups.spaces]
    slots = appo.RolloutSlots(specs, num_slots=3, rollout=4, num_workers=1, num_splits=1)
    (first, _), (second, tensors) = slots.fields(specs[0]), slots.fields(specs[1])
    assert first["observation"].shape == (3, 5, 5) and second["observation"].shape == (3, 5, 6)
    first["reward"][1, 2] = 7.0
    assert second["reward"][1, 2] == 7.0 and tensors["reward"][1, 2] == 7.0  # one field, one memory
    second["observation"][1, 2] = 1.0
    assert not first["observation"].any()
    assert slots.arrays is not None and slots.arrays["observation"].shape == (3, 5, 5)  # the first group's


def checkpoint_of(train_dir, experiment: str, policy: int) -> dict:
    path = sorted(glob.glob(os.path.join(train_dir, experiment, f"checkpoint_p{policy}", "checkpoint_*.pth")))[-1]
    return torch.load(path, map_location="cpu", weights_only=True)


def test_a_serial_run_trains_each_group_with_its_own_model_on_its_agents_steps_and_repeats(tmp_path):
    for experiment in ("first", "second"):
        assert appo.main(["--env", UNEQUAL, "--train_dir", str(tmp_path), "--experiment", experiment, *SERIAL,
                          "--train_for_env_steps", "400"]) == 0
    first = [checkpoint_of(tmp_path, "first", policy) for policy in (0, 1)]
    widths = [next(tensor.shape[1] for key, tensor in checkpoint["model"].items()
                   if "observation" in key and key.endswith("weight") and tensor.dim() == 2) for checkpoint in first]
    assert widths == [5, 6]  # each policy's model reads its group's observation
    # a batch holds only its policy's agents: a and b fill p0's batches twice as fast as c fills p1's
    assert first[0]["env_frames"] >= 2 * first[1]["env_frames"] - 16 and first[1]["env_frames"] >= 400
    for policy in (0, 1):  # seeded --serial_mode: the same steps, the same weights
        second = checkpoint_of(tmp_path, "second", policy)
        assert all(torch.equal(tensor, second["model"][key]) for key, tensor in first[policy]["model"].items())


def test_a_policy_of_a_group_never_draws_a_policy_of_another_group(tmp_path):
    cfg = appo.parse_args(["--env", UNEQUAL, "--num_policies", "4", "--remap_policies_every", "1",
                           "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "1",
                           "--rollout", "8", "--train_dir", str(tmp_path)])
    probe = appo.probe_env(cfg)
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    worker = appo.RolloutWorker(0, 0, cfg, shared)
    seen = [set() for _ in worker.actors]
    try:
        assert worker.reset_all()
        for _ in range(60):  # five games of 12 steps, each followed by a remap
            for actor, policies in zip(worker.actors, seen):
                policies.add(actor.policy_id)
                arrays = actor.fields.arrays  # an allowed action, as a policy worker would write
                arrays["actions"][actor.slot, actor.step] = np.flatnonzero(arrays["action_mask"][actor.slot, actor.step])[0]
            assert worker.step_split(0)
            free_handed_slots(cfg, shared)
        assert sum(worker.episodes_per_env) >= 8
        for actor, policies in zip(worker.actors, seen):
            assert policies <= ({0, 2} if actor.agent < 2 else {1, 3}), (actor.agent, policies)
        assert set().union(*seen) == {0, 1, 2, 3}
    finally:
        worker.close()


def test_pbt_ranks_and_copies_within_a_group_only(tmp_path, capsys):
    cfg = appo.parse_args(["--env", UNEQUAL, "--num_policies", "4", "--with_pbt", "--pbt_period_env_steps", "10",
                           "--pbt_replace_fraction", "0.5", "--pbt_replace_reward_gap", "0.1",
                           "--train_dir", str(tmp_path), "--seed", "1"])
    _, probe, (groups, _) = probe_and_groups("--num_policies", "4")
    hyperparams = appo.PolicyHyperparams(cfg, None)
    pbt = appo.PopulationBasedTraining(cfg, hyperparams)
    # the best of all is p3 (group 1); were it ranked with group 0's, p0 and p2 would copy it
    stats = types.SimpleNamespace(episode_objectives=[[1.0], [0.0], [2.0], [9.0]])
    shared = types.SimpleNamespace(run=types.SimpleNamespace(learner_frames=np.full(4, 100)), groups=groups,
                                   hyperparams=hyperparams)
    pbt.step(stats, shared)
    copies = {policy: int(hyperparams.copy_source[policy]) for policy in range(4) if hyperparams.copy_request[policy]}
    assert copies == {0: 2, 1: 3}, capsys.readouterr().out


DONE_LINE = re.compile(r"^done: policy (\d): ([\d,]+) frames trained in .*?; average return (-?[\d.]+) over the last "
                       r"(\d+) games.*; checkpoint (\S+)$", re.MULTILINE)
AGENT_LINE = re.compile(r"^agent (\d) \(policy (\w+)\) mean return (-?[\d.]+) \+- [\d.]+ over (\d+) games; "
                        r"mean length ([\d,]+) env frames$", re.MULTILINE)
PLAYING_LINE = re.compile(r"^playing \S+ on cpu with policy (\d)'s version (\d+) \(([\d,]+) env frames of training\)$",
                          re.MULTILINE)


def whole_games(mean: str, games: int) -> bool:
    """A mean of `games` whole-number returns, printed to 2 decimals."""
    return abs(float(mean) * games - round(float(mean) * games)) <= 0.005 * games + 1e-9


@pytest.mark.slow
def test_a_mixed_env_trains_with_no_flag_but_env_then_evaluates_per_group_and_resumes(tmp_path):
    """UnequalSpaces (pz_envs): a step scores 1 for the lower allowed action, so a and b (group 0,
    policy 0) score a whole number within GAME_STEPS = 12 a game, c (group 1, policy 1, gone after
    LEAVES_AFTER = 4 steps) within 4, and every game lasts 12 steps (env frames: frameskip 1)."""
    most = {0: pz_envs.GAME_STEPS, 1: pz_envs.LEAVES_AFTER}
    short = ["--num_workers", "1", "--num_envs_per_worker", "2", "--report_every_sec", "2", "--experiment", "mixed"]
    trained = run_appo(tmp_path, UNEQUAL, *short, "--train_for_env_steps", "3000")
    out = trained.stdout + trained.stderr
    assert trained.returncode == 0, out[-3000:]
    for policy in (0, 1):  # status lines: each policy's 100-game average within its group's bounds
        averages = [float(a) for a in re.findall(rf"\bp{policy} avg return (-?[\d.]+) \(\d+ ep\)", out)]
        assert averages and all(0 <= a <= most[policy] for a in averages), (policy, averages)
    done = {int(policy): (int(frames.replace(",", "")), float(average), int(games), path)
            for policy, frames, average, games, path in DONE_LINE.findall(out)}
    assert sorted(done) == [0, 1], out[-3000:]
    saved = {policy: checkpoint_of(tmp_path, "mixed", policy) for policy in (0, 1)}
    for policy, (frames, average, games, path) in done.items():
        assert frames >= 3000 and 0 <= average <= most[policy] and games > 0, (policy, done[policy])
        assert os.path.exists(path) and saved[policy]["env_frames"] == frames, (policy, path)

    played = run_appo(tmp_path, UNEQUAL, "--mode", "eval", "--experiment", "mixed", "--max_num_episodes", "3")
    out = played.stdout + played.stderr
    assert played.returncode == 0, out[-3000:]
    assert {(int(policy), int(version), int(frames.replace(",", ""))) for policy, version, frames in
            PLAYING_LINE.findall(out)} == {(policy, saved[policy]["policy_version"], saved[policy]["env_frames"])
                                           for policy in (0, 1)}
    agents = AGENT_LINE.findall(out)
    assert [(agent, policy, games, length) for agent, policy, _, games, length in agents] == [
        ("0", "0", "3", "12"), ("1", "0", "3", "12"), ("2", "1", "3", "12")], out[-3000:]
    means = [mean for _, _, mean, _, _ in agents]
    assert all(whole_games(mean, 3) and 0 <= float(mean) <= most[0 if agent < 2 else 1]
               for agent, mean in enumerate(means)), means
    groups = bench_groups.GROUP_LINE.findall(out)  # what bench/bench_groups.py reads: each group's agents' mean
    assert [line[:3] for line in groups] == [("0", "a, b", "0"), ("1", "c", "1")]
    assert float(groups[0][3]) == pytest.approx((float(means[0]) + float(means[1])) / 2, abs=0.006)
    assert groups[1][3] == means[2]

    against_random = run_appo(tmp_path, UNEQUAL, "--mode", "eval", "--experiment", "mixed", "--max_num_episodes", "3",
                              "--agent_policies", "a=0,b=0,c=random", "--seed", "1")
    out = against_random.stdout + against_random.stderr
    assert against_random.returncode == 0, out[-3000:]
    assert "with policy 1's" not in out  # no checkpoint of policy 1 is loaded
    agents = AGENT_LINE.findall(out)
    assert [(agent, policy) for agent, policy, _, _, _ in agents] == [("0", "0"), ("1", "0"), ("2", "random")]
    c_mean = agents[2][2]
    assert whole_games(c_mean, 3) and 0 <= float(c_mean) <= pz_envs.LEAVES_AFTER
    assert bench_groups.GROUP_LINE.findall(out)[1] == ("1", "c", "random", c_mean)

    resumed = run_appo(tmp_path, UNEQUAL, *short, "--train_for_env_steps", "6000")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    for policy in (0, 1):  # each from its own last checkpoint
        assert (f"policy {policy} resumed from policy version {saved[policy]['policy_version']}, "
                f"{saved[policy]['env_frames']:,} env frames (") in out, out[-3000:]
        assert checkpoint_of(tmp_path, "mixed", policy)["env_frames"] >= 6000


def test_the_groups_bench_plays_every_group_trained_and_random_and_each_trained_alone():
    members, policies = bench_groups.env_groups(UNEQUAL)
    assert members == [["a", "b"], ["c"]] and policies == [0, 1]
    assert bench_groups.pairings(members, policies) == {
        "random": "a=random,b=random,c=random", "trained": None,
        "0 trained": "a=0,b=0,c=random", "1 trained": "a=random,b=random,c=1"}


@pytest.mark.slow
def test_the_groups_bench_reads_each_groups_score_from_a_real_evaluation_of_every_pairing(tmp_path, monkeypatch):
    """bench_groups.evaluate plays a pairing with appo.py --mode eval and reads its group lines
    (GROUP_LINE). On pz_envs.ScoresEveryStep every agent scores 1 a step whatever it plays, trained or
    random: a and b (group 0) GAME_STEPS = 12 a game, c (group 1) LEAVES_AFTER = 4, so every pairing's
    scores, in group order, are [12.0, 4.0]."""
    name = "pz:pz_envs:scores_every_step"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                      os.environ.get("PYTHONPATH", "")]))  # eval imports pz_envs
    assert appo.main(["--env", name, "--train_dir", str(tmp_path), "--experiment", "run", *SERIAL,
                      "--train_for_env_steps", "200"]) == 0
    members, policies = bench_groups.env_groups(name)
    assert members == [["a", "b"], ["c"]] and policies == [0, 1]
    expected = [float(pz_envs.GAME_STEPS), float(pz_envs.LEAVES_AFTER)]
    assert expected == [12.0, 4.0]
    for pairing, mapping in bench_groups.pairings(members, policies).items():
        assert bench_groups.evaluate(name, str(tmp_path), 1, 2, mapping) == expected, pairing


def expected_groups(env_class) -> dict[str, int]:
    """Each agent's group, read off the env class's own spaces (pz_envs.py): agents seeing the same
    observation shape share a group, numbered in the order the agents come."""
    made = env_class()
    shapes = {name: made.observation_space(name)["observation"].shape for name in made.possible_agents}
    order = list(dict.fromkeys(shapes.values()))
    return {name: order.index(shape) for name, shape in shapes.items()}


def test_random_play_scores_each_group_apart():
    """random_play reports each agent's whole-game return with its group, a game's returns in the
    agents' order. In pz_envs a and b see 5 values and c 6: a, b are group 0 and c group 1, two
    group-0 returns to each group-1 return. Where every agent scores 1 a step (ScoresEveryStep), a and b
    score the game's GAME_STEPS (12) and c, which leaves after LEAVES_AFTER (4) steps, 4. On
    UnequalSpaces a step scores 1 only for the lower of the two allowed actions: whole numbers, at
    most 12 and 4."""
    groups = expected_groups(pz_envs.UnequalSpaces)
    assert groups == {"a": 0, "b": 0, "c": 1}
    games = 10
    returns, of_group = random_play.play("pz:pz_envs:scores_every_step", episodes=3 * games, seed=0)
    assert of_group == [groups["a"], groups["b"], groups["c"]] * games
    assert returns == [float(pz_envs.GAME_STEPS), float(pz_envs.GAME_STEPS), float(pz_envs.LEAVES_AFTER)] * games
    assert (pz_envs.GAME_STEPS, pz_envs.LEAVES_AFTER) == (12, 4)
    returns, of_group = random_play.play(UNEQUAL, episodes=3 * games, seed=0)
    assert of_group == [0, 0, 1] * games
    most = {0: pz_envs.GAME_STEPS, 1: pz_envs.LEAVES_AFTER}
    assert all(r == int(r) and 0 <= r <= most[g] for r, g in zip(returns, of_group)), list(zip(returns, of_group))
