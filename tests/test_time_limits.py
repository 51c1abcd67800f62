"""A time limit is not a death (--value_bootstrap): the rollout keeps the observation an episode was
cut at, the losses' targets go on from its value, and an episode that really ended keeps 0. The
envs are tests/clock_env.py's (its docstring gives the numbers) and pz_envs.TimeLimited."""
import glob
import os
import re
import subprocess
import sys
import uuid

import pytest
import torch

import appo
import clock_env
import env
import pz_envs
from conftest import RUN_TIMEOUT_S, free_handed_slots, gather_slots, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAMMA = 0.9
CONSTANT = 1.0 / (1.0 - GAMMA)  # every step's return where nothing ends it
ROLLOUT = 9  # with clock_env.LIMIT 4: the first slot's cuts fall mid-slot and on its last step


def rollout_worker(tmp_path, env: str, *flags: str):
    cfg = appo.parse_args(["--env", env, "--num_workers", "1", "--num_envs_per_worker", "1", "--worker_num_splits",
                           "1", "--rollout", str(ROLLOUT), "--batch_size", str(ROLLOUT), "--rnn_type", "gru",
                           "--hidden_size", "4", "--gamma", str(GAMMA), "--no-normalize_returns",
                           "--train_dir", str(tmp_path), *flags])
    probe = appo.probe_env(cfg)
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    return cfg, probe, shared, appo.RolloutWorker(0, 0, cfg, shared)


def collect(worker, shared, slots: int) -> list[int]:
    """Steps the worker's env with action 0 until `slots` slots are handed to the learner. Where a
    policy worker would write its value (constant_critic's) and the next RNN state, this writes
    CONSTANT and ones."""
    assert worker.reset_all()
    handed = []
    while len(handed) < slots:
        for actor in worker.actors:
            actor.fields.arrays["value"][actor.slot, actor.step] = CONSTANT
            actor.fields.arrays["rnn_state"][actor.slot, actor.step + 1] = 1.0
        assert worker.step_split(0)
        while shared.learner_queues[0].qsize():
            handed.append(shared.learner_queues[0].get(timeout=1)[0])
    return handed[:slots]


def constant_critic(model: appo.ActorCritic) -> appo.ActorCritic:
    with torch.no_grad():
        model.value_head.weight.zero_()
        model.value_head.bias.fill_(CONSTANT)
    return model


def targets(cfg, probe, batch, with_vtrace: bool) -> torch.Tensor:
    """The value targets [T, B] of a batch, by the learner's GAE or V-trace (on-policy: rho 1)."""
    cfg.with_vtrace = with_vtrace
    model = constant_critic(appo.ActorCritic(*probe.spaces, cfg))
    if not with_vtrace:
        return appo.gae_targets(model, batch, 0, cfg)["target"]
    with torch.no_grad():
        _, values = model.forward_rollout({key: batch[key] for key in model.encoders}, batch["rnn_state"][0],
                                          batch["done"])
        steps = appo.steps_of(batch)
        return appo.vtrace_targets(model, steps, values[:-1], values[-1], torch.zeros_like(values[:-1]), cfg)[0]


def test_a_cut_episode_leaves_its_final_observation_in_the_slot_and_the_next_starts_after_it(tmp_path):
    cfg, probe, shared, worker = rollout_worker(tmp_path, "gym:clock_env:Clock/Cut-v0", "--value_bootstrap")
    try:
        first, second = collect(worker, shared, 2)
        arrays = shared.slots.arrays
        # the clock's episodes (4 steps), each followed by its final observation, a step nobody takes
        assert arrays["obs"][first, :, 0].tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 0]
        assert arrays["obs"][first, :, 1].tolist() == [1] * 5 + [0] * 5  # the episodes' parity
        assert arrays["truncated"][first, :ROLLOUT].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1]
        assert arrays["done"][first, :ROLLOUT].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]
        assert arrays["valid"][first, :ROLLOUT].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1]
        assert arrays["reward"][first, :ROLLOUT].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1]
        # the final observation's RNN state is the one acting left after the cut step; a new episode starts at 0
        assert arrays["rnn_state"][first, [4, 9]].min() == 1.0 and arrays["rnn_state"][first, 5].max() == 0.0
        # the first slot ended on a final observation, which the next goes on from; its new episode a step later
        assert arrays["obs"][second, :2, 1].tolist() == [0, 1] and arrays["rnn_state"][second, 0].min() == 1.0
        assert arrays["valid"][second, :2].tolist() == [0, 1] and arrays["rnn_state"][second, 1].max() == 0.0
    finally:
        worker.close()


def test_without_value_bootstrap_a_time_limit_ends_the_episode_as_a_death_does(tmp_path):
    cfg, probe, shared, worker = rollout_worker(tmp_path, "gym:clock_env:Clock/Cut-v0", "--no-value_bootstrap")
    try:
        (first,) = collect(worker, shared, 1)
        arrays = shared.slots.arrays
        assert arrays["obs"][first, :, 1].tolist() == [1] * 4 + [0] * 4 + [1] * 2
        assert arrays["done"][first, :ROLLOUT].tolist() == [0, 0, 0, 1, 0, 0, 0, 1, 0]
        assert arrays["truncated"][first].max() == 0 and arrays["valid"][first].min() == 1
    finally:
        worker.close()


@pytest.mark.parametrize("with_vtrace", [False, True], ids=["gae", "vtrace"])
def test_the_targets_at_a_time_limit_equal_those_in_the_middle_with_value_bootstrap_and_fall_without(
        tmp_path, with_vtrace):
    for bootstrap in (True, False):
        flags = ["--value_bootstrap" if bootstrap else "--no-value_bootstrap"]
        cfg, probe, shared, worker = rollout_worker(tmp_path / str(bootstrap), "gym:clock_env:Clock/Cut-v0", *flags)
        try:
            batch = gather_slots(shared.slots, collect(worker, shared, 1))
            found = targets(cfg, probe, batch, with_vtrace)[:, 0]
        finally:
            worker.close()
        if bootstrap:  # the steps of both episodes, the cut ones too, but not the untaken step
            assert found[[0, 1, 2, 3, 5, 6, 7, 8]].tolist() == pytest.approx([CONSTANT] * 8, rel=1e-5)
        else:  # each episode's return falls to the last step's reward, 1
            episode = found[:4].tolist()
            assert episode[-1] == pytest.approx(1.0) and episode == sorted(episode, reverse=True)
            assert episode[0] < 0.5 * CONSTANT


@pytest.mark.parametrize("with_vtrace", [False, True], ids=["gae", "vtrace"])
def test_an_episode_the_game_ended_keeps_a_return_of_0_after_it_with_value_bootstrap(tmp_path, with_vtrace):
    cfg, probe, shared, worker = rollout_worker(tmp_path, "gym:clock_env:Clock/Ends-v0", "--value_bootstrap")
    try:
        (first,) = collect(worker, shared, 1)
        assert shared.slots.arrays["obs"][first, :, 1].tolist() == [1] * 4 + [0] * 4 + [1] * 2
        assert shared.slots.arrays["truncated"][first].max() == 0
        found = targets(cfg, probe, gather_slots(shared.slots, [first]), with_vtrace)[:, 0]
    finally:
        worker.close()
    assert found[3] == pytest.approx(1.0) and found[7] == pytest.approx(1.0)


def test_synchronous_collection_parks_a_split_whose_envs_cut_their_episodes_at_different_steps(tmp_path):
    """--no-async_rl: an env whose slot filled a step early (a final observation took a position)
    waits for the split's others, so that every batch is acted by the latest weights."""
    cfg, probe, shared, worker = rollout_worker(tmp_path, "gym:clock_env:Clock/Uneven-v0", "--value_bootstrap",
                                                "--num_envs_per_worker", "2", "--batch_size", str(2 * ROLLOUT),
                                                "--no-async_rl", "--seed", "1")
    try:
        assert worker.reset_all()
        version, parked, share = shared.run.learner_version, 0, worker.gate.rollouts_per_batch
        for _ in range(3 * share * (ROLLOUT + 2)):  # three batches, at the most two early slots a batch
            for actor in worker.actors:  # what a policy worker writes, with the latest weights
                actor.fields.arrays["policy_version"][actor.slot, actor.step] = version[0]
            assert worker.step_split(0)
            free_handed_slots(cfg, shared)  # the learner takes the batch and frees its slots
            if not worker.gate.lets_go(0):
                parked += 1
                assert all(actor.step == 0 for actor in worker.actors)
                version[0] += 1  # the weights trained on the batch
                assert worker.gate.released() == [0]
        assert parked >= 3  # without the wait, once its envs are out of step the split never parks again
    finally:
        worker.close()


def test_in_a_multi_agent_env_only_the_agent_a_time_limit_cut_keeps_its_final_observation(tmp_path):
    cfg, probe, shared, worker = rollout_worker(tmp_path, "pz:pz_envs:time_limited", "--value_bootstrap")
    try:
        worker.reset_all()
        by_name = dict(zip(["cut", "ends", "stays"], worker.actors))
        for _ in range(pz_envs.LIMIT_STEPS + 1):
            assert worker.step_split(0)
        arrays, steps = shared.slots.arrays, pz_envs.LIMIT_STEPS
        cut, ends, stays = (by_name[name].slot for name in ("cut", "ends", "stays"))
        # its step after the cut is one out of the game, at its final observation: that value bootstraps the cut
        assert arrays["truncated"][cut, :steps + 1].tolist() == [0, 0, 1, 0]
        assert arrays["done"][cut, :steps + 1].tolist() == [0, 0, 0, 1]
        assert arrays["valid"][cut, :steps + 1].tolist() == [1, 1, 1, 0]
        assert arrays["obs"][cut, steps, 0] == steps
        assert arrays["truncated"][ends].max() == 0 and arrays["done"][ends, :steps + 1].tolist() == [0, 0, 1, 1]
        assert arrays["truncated"][stays].max() == 0 and arrays["done"][stays, :steps + 1].max() == 0
        assert by_name["cut"].step == by_name["ends"].step == by_name["stays"].step == steps + 1
    finally:
        worker.close()


def learned_values(train_dir, flags: list[str]) -> list[float]:
    """The trained critic's return estimate at the clock's observations of each step, in an
    episode of each parity."""
    cfg = appo.parse_args(flags)
    model = appo.ActorCritic(*appo.probe_env(cfg).spaces, cfg)
    path = sorted(glob.glob(str(train_dir / cfg.experiment / "checkpoint_p0" / "checkpoint_*.pth")))[-1]
    model.load_state_dict(torch.load(path, weights_only=True)["model"])
    obs = torch.tensor([[step, parity] for parity in (0, 1) for step in range(clock_env.LIMIT)],
                       dtype=torch.float32)
    with torch.no_grad():
        _, values, _ = model({"obs": obs}, torch.zeros(len(obs), appo.rnn_state_size(cfg)))
        return model.values_to_returns(values).view(2, clock_env.LIMIT).mean(0).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["processes-vtrace", "serial-gae", "serial-gae-off"])
def test_a_trained_critic_values_the_last_steps_before_a_time_limit_as_the_first_with_value_bootstrap(
        tmp_path, mode):
    tag = uuid.uuid4().hex
    flags = ["--env", "gym:clock_env:Clock/Cut-v0", "--gamma", str(GAMMA), "--seed", "1", "--train_for_env_steps",
             "20000", "--lr_schedule", "constant", "--num_workers", "2", "--num_envs_per_worker", "2", "--train_dir", str(tmp_path),
             "--experiment", mode, "--value_bootstrap"]
    flags += {"processes-vtrace": ["--with_vtrace"], "serial-gae": ["--serial_mode"],
              "serial-gae-off": ["--serial_mode", "--no-value_bootstrap"]}[mode]
    tests = os.path.dirname(os.path.abspath(__file__))  # clock_env imports in every process
    run = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), *flags], capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=dict(
                             os.environ, APPO_TEST_TAG=tag,
                             PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert processes_still_tagged(tag) == []
    values = learned_values(tmp_path, flags)
    if mode == "serial-gae-off":  # the clock's returns: 1 + 0.9 + 0.81 + 0.73 down to 1
        assert values == pytest.approx([3.44, 2.71, 1.9, 1.0], abs=0.2)
    else:
        assert values == pytest.approx([CONSTANT] * clock_env.LIMIT, rel=0.05)


# Every built-in family's envs, one of each kind its defaults tell apart (gym: and pz: by what they
# observe: vectors, images, images too small for the default encoder): a family added to env.py must be
# named here, so that what it defaults --value_bootstrap to is checked against R0's table.
FAMILY_EXAMPLES = {
    "the Doom family": ("doom_basic", "doom_my_way_home", "doom_deadly_corridor"),
    "the Doom matches": ("doom_duel_bots", "doom_deathmatch_bots"),
    "the Atari family": ("atari_pong", "atari_breakout"),
    "the DeepMind Lab family": ("dmlab_30", "dmlab_nav_maze_static_01"),
    "the gym: family": ("gym:CartPole-v1", "gym:clock_env:Clock/Cut-v0", "gym:small_image_env:SmallView-v0",
                        "gym:ale_py:ALE/Pong-v5"),  # ale_py registers its ids when imported
    "the pz: family": ("pz:pz_envs:time_limited", "pz:pz_envs:unequal_spaces", "pz:pz_envs:pictures"),
}


def r0_measured_families() -> dict:
    """{env.py family: the R0 rows that measured it}, from learning.md's table under "Time limits
    bootstrapped": a row is "<families> (<env measured>)", where a family is named by its env's
    name prefix ("gym:", "pz:") or by the measured env itself ("Doom scenarios", "Atari")."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        text = f.read().split("## Time limits bootstrapped (`--value_bootstrap`)\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[0] == "family (env)" and header[-1] == "default" and set(lines[1]) <= set("|-")
    measured = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        label, measured_env = re.fullmatch(r"(.+) \((\S+)\)", cells[0]).groups()
        assert cells[-1].startswith("on since "), cells  # R0 held on every row
        # a row is a measurement: 3 seeds or more saved without and with it (time_limits/ holds Doom's
        # and Atari's, the ablation's defaults and bootstrap arms the gym: and pz: families')
        for side in (("time_limits/*_off", "gym_ablation/defaults"), ("time_limits/*_on", "gym_ablation/bootstrap")):
            saved = [path for folder in side for path in glob.glob(
                os.path.join(REPO, "docs", "bench", folder, glob.escape(measured_env), "appo_seed*.json"))]
            assert len(saved) >= 3, (cells[0], side)
        families = [env.family_of(measured_env)]  # the measured env's own family
        families += [env.family_of(f"{prefix}module:name") for prefix in label.split(" and ") if prefix.endswith(":")]
        assert None not in families, label
        for title in {family.title for family in families}:
            measured.setdefault(title, []).append(cells[0])
    return measured


def test_value_bootstrap_is_a_default_only_where_it_was_measured():
    """R0 (docs/results/learning.md): --value_bootstrap is a family's default only once measured on
    one of its envs; "until its measurement a family keeps it off". Every family in env.py, each kind
    of env it tells apart, is on exactly where R0's table has a row for it: the Doom scenarios
    (doom_basic), Atari (atari_pong), gym: and pz: (HalfCheetah, Walker2d, Hopper, LunarLander)."""
    measured = r0_measured_families()
    assert sorted(measured) == ["the Atari family", "the Doom family", "the gym: family", "the pz: family"]
    assert len(measured["the gym: family"]) == 4 and measured["the gym: family"] == measured["the pz: family"]
    built_in = [family for family in env.FAMILIES if not family.registered]
    assert sorted(family.title for family in built_in) == sorted(FAMILY_EXAMPLES)  # a new family: name its envs
    defaulting_on = set()
    for family in built_in:
        names = FAMILY_EXAMPLES[family.title]
        assert all(env.family_of(name) is family for name in names), family.title
        if isinstance(family.flag_defaults, dict):  # one set of defaults for the whole family
            values = {family.flag_defaults.get("value_bootstrap", False)}
        else:  # defaults by name: what each kind of env gets
            values = {family.flag_defaults(name).get("value_bootstrap", False) for name in names}
        # and what a user gets from the command line, which --no-value_bootstrap turns off
        assert {appo.parse_args(["--env", name]).value_bootstrap for name in names} == values, family.title
        for name in names:
            assert appo.parse_args(["--env", name, "--no-value_bootstrap"]).value_bootstrap is False, name
        assert len(values) == 1, (family.title, values)  # R0 is a rule per family: all its kinds alike
        if values == {True}:
            defaulting_on.add(family.title)
    assert defaulting_on == set(measured)


def test_doom_basic_reports_its_timeout_as_a_truncation_through_the_trainers_env():
    agents = appo.make_env(appo.parse_args(["--env", "doom_basic"]), 0)
    try:
        agents.reset()
        for step in range(1000):  # standing still, the monster lives: the scenario's 300 tics run out
            _, _, dones, truncations, _ = agents.step([0])
            if dones[0]:
                break
        assert dones == [True] and truncations == [True] and 60 <= step < 80  # 300 tics / frameskip 4
    finally:
        agents.close()
