"""Duel and deathmatch Doom envs (env.py's DoomMatchEnv, reward shaping, measurements) against real
VizDoom games: bots hosted by one game, agents that join each other over UDP on this machine."""
import argparse
import functools
import os
import shutil
import signal
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import vizdoom  # in the [test] extra: a broken install must fail the suite, not skip this module

import env as envs
from conftest import doom_player_threads, vizdoom_gone, vizdoom_processes
from env import create_env, env_defaults, env_error, get_num_agents, reward_shaping_weights, set_reward_shaping

DOOM_NO_TURN = envs.DOOM_TURN_DEGREES.index(0.0)  # the turn head's middle bin: no turning

# 0.05 minutes of game time: 105 tics, 53 steps at frameskip 2
SHORT_MATCH_MINUTES = 0.05
SHORT_MATCH_TICS = 105


def flags(**values) -> argparse.Namespace:
    """A stand-in for appo.py's parsed flags."""
    return argparse.Namespace(**values)


@pytest.fixture
def make_match(make_doom):
    """conftest's make_doom, at frameskip 2 unless given."""
    return functools.partial(make_doom, env_frameskip=2)


def random_actions(env, seed=0):
    env.action_space.seed(seed)
    if get_num_agents(env) == 1:
        return env.action_space.sample
    return lambda: [env.action_space.sample() for _ in range(get_num_agents(env))]


def noop(env):
    """No button, no turning (the turn head's middle bin)."""
    action = [0] * len(env.action_space)
    action[-1] = DOOM_NO_TURN
    return tuple(action)


def measurement(obs, name: str) -> float:
    """The unscaled value of one measurement (exact for values inside the clip range)."""
    index = envs.DOOM_MEASUREMENT_NAMES.index(name)
    return float(obs["measurements"][index]) * envs.DOOM_MEASUREMENTS[index][1]


def assert_observation(obs, space) -> None:
    assert set(obs) == {"obs", "measurements"}
    assert obs["obs"].shape == (3, 72, 128) and obs["obs"].dtype == np.uint8
    assert obs["measurements"].shape == (23,) and obs["measurements"].dtype == np.float32
    assert space.contains(obs)


# ------------------------------------------------------------------------------------------------
# Action space
# ------------------------------------------------------------------------------------------------

# What each option of each head must press, written out from the paper's action space.
FULL_HEADS = {
    "move": [{}, {"MOVE_FORWARD": 1}, {"MOVE_BACKWARD": 1}],
    "strafe": [{}, {"MOVE_RIGHT": 1}, {"MOVE_LEFT": 1}],
    "attack": [{}, {"ATTACK": 1}],
    "sprint": [{}, {"SPEED": 1}],
    "use": [{}, {"USE": 1}],
    "weapon": [{}] + [{f"SELECT_WEAPON{slot}": 1} for slot in range(1, 8)],
    "turn": [{"TURN_LEFT_RIGHT_DELTA": -12.5 + 1.25 * i} for i in range(21)],
}


@pytest.mark.parametrize("name, heads", [
    ("doom_duel_bots", list(FULL_HEADS)),
    ("doom_deathmatch_bots", [head for head in FULL_HEADS if head != "use"]),
])
def test_every_option_presses_its_buttons(make_match, name, heads):
    env = make_match(name)
    assert env.action_space == gym.spaces.Tuple([gym.spaces.Discrete(len(FULL_HEADS[head])) for head in heads])
    buttons = [button.name for button in env.games[0].get_available_buttons()]
    assert sorted(buttons) == sorted({button for head in heads for option in FULL_HEADS[head] for button in option})
    assert ("USE" in buttons) == ("use" in heads)

    neutral = list(noop(env))
    for index, head in enumerate(heads):
        for option, expected in enumerate(FULL_HEADS[head]):
            action = list(neutral)
            action[index] = option
            sent = dict(zip(buttons, env.buttons_for(tuple(action))))
            pressed = {button: value for button, value in sent.items() if value != 0}
            assert pressed == {button: value for button, value in expected.items() if value != 0}, (head, option)
    assert FULL_HEADS["turn"][DOOM_NO_TURN] == {"TURN_LEFT_RIGHT_DELTA": 0.0}


def test_turning_and_weapon_selection_in_the_game(make_match):
    env = make_match("doom_deathmatch_bots", doom_match_minutes=1.0)
    game = env.games[0]
    env.reset(seed=3)
    for _ in range(5):  # the player can turn only once it has fully spawned
        env.step(noop(env))

    def angle_after(turn_bin: int) -> float:
        before = game.get_game_variable(vizdoom.GameVariable.ANGLE)
        action = list(noop(env))
        action[-1] = turn_bin
        env.step(tuple(action))
        return (game.get_game_variable(vizdoom.GameVariable.ANGLE) - before + 180) % 360 - 180

    # VizDoom applies the delta on each of the step's 2 tics; positive values turn right (clockwise)
    assert angle_after(0) == pytest.approx(25.0, abs=0.1)
    assert angle_after(20) == pytest.approx(-25.0, abs=0.1)
    assert angle_after(DOOM_NO_TURN) == pytest.approx(0.0, abs=0.1)

    obs, *_ = env.step(noop(env))
    assert measurement(obs, "SELECTED_WEAPON") == pytest.approx(2)  # everyone starts with the pistol
    select_fist = list(noop(env))
    select_fist[4] = 1  # weapon head (no use head here): SELECT_WEAPON1
    for _ in range(15):  # lowering one weapon and raising the other takes a few tics
        obs, *_ = env.step(tuple(select_fist))
    assert measurement(obs, "SELECTED_WEAPON") == pytest.approx(1)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------


def game_variables(**values) -> dict[str, float]:
    """A full set of DOOM_MATCH_VARIABLES: a live player with 100 health and nothing else."""
    variables = dict.fromkeys(envs.DOOM_MATCH_VARIABLES, 0.0)
    variables["HEALTH"] = 100.0
    variables.update(values)
    return variables


def test_measurement_scaling():
    names = envs.DOOM_MEASUREMENT_NAMES
    assert len(names) == 23 and names[:7] == (
        "SELECTED_WEAPON", "SELECTED_WEAPON_AMMO", "HEALTH", "ARMOR", "FRAGCOUNT", "ATTACK_READY", "PLAYER_COUNT")
    assert names[7:] == tuple(f"WEAPON{i}" for i in range(8)) + tuple(f"AMMO{i}" for i in range(8))

    scaled = dict(zip(names, envs.doom_measurements(game_variables(
        SELECTED_WEAPON=7, SELECTED_WEAPON_AMMO=50, ARMOR=200, FRAGCOUNT=10, ATTACK_READY=1, PLAYER_COUNT=8,
        WEAPON3=2, AMMO2=100, AMMO5=100, AMMO6=300))))
    assert scaled["HEALTH"] == 1.0  # full health
    assert scaled["ARMOR"] == 2.0  # blue armour
    assert scaled["SELECTED_WEAPON"] == 1.0
    assert scaled["SELECTED_WEAPON_AMMO"] == 0.5
    assert scaled["FRAGCOUNT"] == 0.5
    assert scaled["ATTACK_READY"] == 1.0
    assert scaled["PLAYER_COUNT"] == 1.0
    assert scaled["WEAPON3"] == 2.0  # shotgun and super shotgun
    assert scaled["AMMO2"] == 0.5  # 100 of 200 bullets
    assert scaled["AMMO5"] == 2.0  # 100 rockets: a backpack's worth
    assert scaled["AMMO6"] == 1.0  # 300 cells

    extremes = dict(zip(names, envs.doom_measurements(game_variables(
        HEALTH=-999900, AMMO2=10_000, SELECTED_WEAPON_AMMO=600, FRAGCOUNT=-40))))
    assert extremes["HEALTH"] == 0.0  # telefragged
    assert extremes["AMMO2"] == 2.0
    assert extremes["SELECTED_WEAPON_AMMO"] == 3.0
    assert extremes["FRAGCOUNT"] == -1.0


def test_measurements_on_real_steps(make_match):
    env = make_match("doom_deathmatch_bots", doom_match_minutes=1.0)
    space = env.observation_space
    assert space["measurements"] == gym.spaces.Box(
        np.array([low for _, _, low, _ in envs.DOOM_MEASUREMENTS], np.float32),
        np.array([high for _, _, _, high in envs.DOOM_MEASUREMENTS], np.float32))
    obs, _ = env.reset(seed=0)
    assert_observation(obs, space)
    assert obs["measurements"][envs.DOOM_MEASUREMENT_NAMES.index("HEALTH")] == 1.0  # 100 health
    game = env.games[0]
    step = random_actions(env)
    for _ in range(100):
        obs, *_ = env.step(step())
        assert_observation(obs, space)
    assert measurement(obs, "PLAYER_COUNT") == 8  # the agent and 7 bots
    assert measurement(obs, "HEALTH") == pytest.approx(max(0, game.get_game_variable(vizdoom.GameVariable.HEALTH)))


# ------------------------------------------------------------------------------------------------
# Reward shaping
# ------------------------------------------------------------------------------------------------


def test_reward_shaping_on_scripted_game_variables():
    shaping = envs.DoomRewardShaping()
    weights = envs.DOOM_REWARD_SHAPING
    player = game_variables(WEAPON2=1, AMMO2=50, SELECTED_WEAPON=2)
    shaping.start(player)

    def after(**changes) -> float:
        player.update(changes)
        return shaping.reward(dict(player))

    assert after() == 0.0
    assert after(FRAGCOUNT=1) == pytest.approx(weights["frag"])
    assert after(HITCOUNT=2, DAMAGECOUNT=30) == pytest.approx(2 * weights["hit"] + 30 * weights["damage"])
    # taking damage loses health; only damage_taken and hit_taken count it
    assert after(HITS_TAKEN=1, DAMAGE_TAKEN=20, HEALTH=80) == pytest.approx(
        weights["hit_taken"] + 20 * weights["damage_taken"])
    assert after(HEALTH=100) == pytest.approx(20 * weights["health"])  # a medikit
    assert after(ARMOR=100) == pytest.approx(100 * weights["armor"])
    # a rocket launcher with 10 rockets: preference 1.0, a fifth of a full load
    assert after(WEAPON5=1, AMMO5=10) == pytest.approx(weights["weapon"] + weights["ammo"] * 10 / 50)
    assert after(AMMO5=9) == 0.0  # firing
    # dying: the inventory goes, which no shaping term may count
    assert after(DEATHCOUNT=1, HEALTH=-20, ARMOR=0, WEAPON5=0, AMMO5=0, AMMO2=0) == pytest.approx(weights["death"])
    assert after(HEALTH=100, WEAPON2=1, AMMO2=50) == 0.0  # respawning refills health and gives a pistol
    # a telefrag counts as 1,000,000 damage; no step is worth more than 200 hit points
    assert after(DAMAGE_TAKEN=20 + 1_000_000, DEATHCOUNT=2, HEALTH=-999900) == pytest.approx(
        200 * weights["damage_taken"] + weights["death"])
    assert after(FRAGCOUNT=0) == pytest.approx(-weights["frag"])  # a suicide


def test_reward_shaping_weights_are_mutable_and_checked():
    assert set(envs.DOOM_REWARD_SHAPING) == {
        "frag", "death", "hit", "damage", "hit_taken", "damage_taken", "health", "armor", "weapon", "ammo"}
    shaping = envs.DoomRewardShaping({"frag": 3.0, "death": 0.0})
    shaping.start(game_variables())
    assert shaping.reward(game_variables(FRAGCOUNT=1, DEATHCOUNT=1, HEALTH=-5)) == 3.0
    with pytest.raises(ValueError, match="fragz.*known are frag"):
        shaping.set_weights({"fragz": 1.0})
    assert shaping.weights["frag"] == 3.0


def test_set_reward_shaping_changes_the_env_reward(make_match):
    env = make_match("doom_duel_bots", doom_match_minutes=1.0, seed=1)
    assert reward_shaping_weights(env) == envs.DOOM_REWARD_SHAPING
    wrapped = gym.wrappers.TimeLimit(env, max_episode_steps=10**6)  # functions walk down the wrappers
    assert reward_shaping_weights(wrapped) == envs.DOOM_REWARD_SHAPING

    env.reset(seed=1)
    step = random_actions(env, seed=1)
    # random players on this map keep falling into its pit: frags -1 and a death
    rewards = [env.step(step())[1] for _ in range(150)]
    assert any(reward < -1 for reward in rewards)

    set_reward_shaping(wrapped, 0, dict.fromkeys(envs.DOOM_REWARD_SHAPING, 0.0))
    assert set(reward_shaping_weights(env).values()) == {0.0}
    assert all(env.step(step())[1] == 0.0 for _ in range(150))

    with pytest.raises(ValueError, match="suicide"):
        set_reward_shaping(env, 0, {"suicide": -1.0})
    with pytest.raises(ValueError, match="agent 1"):
        set_reward_shaping(env, 1, {"frag": 1.0})


def test_envs_without_shaping(make_match):
    env = create_env("doom_basic", flags(seed=0))
    try:
        assert reward_shaping_weights(env) is None
        with pytest.raises(ValueError, match="no reward shaping"):
            set_reward_shaping(env, 0, {"frag": 1.0})
        env.reset()
        env.action_space.seed(0)
        while True:
            *_, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                break
        assert info["true_objective"] == info["true_return"]  # every env reports the objective
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------
# Matches
# ------------------------------------------------------------------------------------------------


def test_duel_steps_both_agents_in_lockstep(make_match):
    # frameskip 3: more tics than one VizDoom call of a network player may run (DOOM_NET_TICS_PER_CALL)
    env = make_match("doom_duel", render_mode="rgb_array", env_frameskip=3, doom_match_minutes=SHORT_MATCH_MINUTES,
                     seed=1)
    assert get_num_agents(env) == 2
    games = env.games
    obs, infos = env.reset()
    assert len(obs) == len(infos) == 2
    for agent_obs in obs:
        assert_observation(agent_obs, env.observation_space)
    assert measurement(obs[0], "PLAYER_COUNT") == measurement(obs[1], "PLAYER_COUNT") == 2

    step = random_actions(env)
    steps = 0
    while True:
        tics = [game.get_episode_time() for game in games]
        obs, rewards, terminated, truncated, infos = env.step(step())
        steps += 1
        assert len(obs) == len(rewards) == len(terminated) == len(truncated) == len(infos) == 2
        assert all(isinstance(reward, float) for reward in rewards)
        if terminated[0]:
            break
        assert [game.get_episode_time() for game in games] == [tic + 3 for tic in tics]
        for agent_obs in obs:
            assert_observation(agent_obs, env.observation_space)
        assert not any(terminated) and not any(truncated) and infos == [{}, {}]
        assert env.render().shape == (120, 160, 3)

    assert terminated == [True, True] and truncated == [False, False]  # the match ends for both at once
    assert steps == -(-SHORT_MATCH_TICS // 3)
    frags = [game.get_game_variable(vizdoom.GameVariable.FRAGCOUNT) for game in games]
    assert [info["true_return"] for info in infos] == frags
    assert [info["true_length"] for info in infos] == [3 * steps] * 2
    objectives = [info["true_objective"] for info in infos]
    assert objectives == [1.0 if frags[0] > frags[1] else 0.0, 1.0 if frags[1] > frags[0] else 0.0]

    # a reset in the middle of a match starts a new one for both
    env.reset()
    for _ in range(5):
        env.step(step())
    obs, _ = env.reset()
    assert [game.get_episode_time() for game in games] == [1, 1]
    obs, _, terminated, _, _ = env.step(step())
    assert [game.get_episode_time() for game in games] == [4, 4] and terminated == [False, False]

    # each agent has its own shaping
    set_reward_shaping(env, 1, dict.fromkeys(envs.DOOM_REWARD_SHAPING, 0.0))
    assert env.reward_shaping_weights(0) == envs.DOOM_REWARD_SHAPING
    assert set(env.reward_shaping_weights(1).values()) == {0.0}


def test_many_duels_on_one_machine_get_distinct_ports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = vizdoom_processes()
    duels = []
    try:
        for index in range(8):
            duels.append(create_env("doom_duel", flags(env_frameskip=2, seed=index)))
        processes = {pid: iid for pid, iid in vizdoom_processes().items() if pid not in before}
        assert len(processes) == 16
        ports = [duel.port for duel in duels]
        assert len(set(ports)) == 8
        for duel in duels:
            obs, _ = duel.reset()
            obs, rewards, *_ = duel.step([noop(duel)] * 2)
            assert len(obs) == 2 and len(rewards) == 2
    finally:
        for duel in duels:
            duel.close()
    vizdoom_gone(processes)
    assert not doom_player_threads()


def test_reserved_ports_are_distinct_and_outside_the_ephemeral_range():
    low, high = envs._ephemeral_port_range()
    reserved = [envs._reserve_match_port() for _ in range(200)]
    try:
        ports = [port for port, _ in reserved]
        assert len(set(ports)) == len(ports)
        assert not any(low <= port <= high for port in ports)
    finally:
        for _, token in reserved:
            token.close()


@pytest.mark.parametrize("name, players", [("doom_duel_bots", 2), ("doom_deathmatch_bots", 8)])
def test_against_bots(make_match, name, players):
    env = make_match(name, doom_match_minutes=SHORT_MATCH_MINUTES, seed=2)
    assert get_num_agents(env) == 1
    game = env.games[0]
    env.reset()
    step = random_actions(env)
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(step())
        steps += 1
        assert isinstance(reward, float)
        if terminated or truncated:
            break
        assert_observation(obs, env.observation_space)
        assert "true_return" not in info
        if steps == 3:  # bots join on the first tics of a match
            assert measurement(obs, "PLAYER_COUNT") == players
        assert steps <= -(-SHORT_MATCH_TICS // 2)  # respawning takes tics of its own: fewer steps, never more
    assert terminated and not truncated
    assert game.get_episode_time() == SHORT_MATCH_TICS
    assert info["true_return"] == game.get_game_variable(vizdoom.GameVariable.FRAGCOUNT)
    assert info["true_objective"] == info["true_return"]  # against bots the objective is the frags
    assert info["true_length"] == 2 * steps


def test_seed_from_flags(make_match):
    # cfg.seed + env_index seeds the first reset; deathmatch starts are drawn at random
    def first_frame(**flag_values):
        obs, _ = make_match("doom_deathmatch_bots", doom_match_minutes=1.0, **flag_values).reset()
        return obs["obs"]

    from_flags = first_frame(seed=5, env_index=2)
    assert np.array_equal(from_flags, first_frame(seed=6, env_index=1))
    assert not np.array_equal(from_flags, first_frame(seed=8))


def test_deathmatch_with_four_agents_and_four_bots(make_match):
    env = make_match("doom_deathmatch_full", doom_match_minutes=SHORT_MATCH_MINUTES, seed=0)
    assert get_num_agents(env) == 4
    assert "USE" not in [button.name for button in env.games[0].get_available_buttons()]
    obs, _ = env.reset()
    step = random_actions(env)
    while True:
        obs, rewards, terminated, truncated, infos = env.step(step())
        if any(terminated):
            break
        assert all(measurement(agent_obs, "PLAYER_COUNT") in (4, 8) for agent_obs in obs)  # bots join at once
    assert terminated == [True] * 4
    assert all(measurement(agent_obs, "PLAYER_COUNT") == 8 for agent_obs in obs)
    frags = [info["true_return"] for info in infos]
    assert frags == [game.get_game_variable(vizdoom.GameVariable.FRAGCOUNT) for game in env.games]
    for agent, info in enumerate(infos):
        best_alone = all(frags[agent] > frags[other] for other in range(4) if other != agent)
        assert info["true_objective"] == (1.0 if best_alone else 0.0)


# ------------------------------------------------------------------------------------------------
# Battle, names, defaults
# ------------------------------------------------------------------------------------------------


def test_battle_needs_its_files(make_match, tmp_path):
    for name, cfg_file in [("doom_battle", "battle.cfg"), ("doom_battle2", "battle2.cfg")]:
        line = env_error(name)
        assert cfg_file in line and "--doom_scenarios_dir" in line and "\n" not in line
        with pytest.raises(FileNotFoundError) as raised:
            create_env(name)
        assert str(raised.value) == line

    # a stand-in for Sample Factory's battle map: basic.wad under the names doom_battle looks for
    scenarios = tmp_path / "maps"
    scenarios.mkdir()
    cfg = flags(doom_scenarios_dir=str(scenarios), env_frameskip=4)
    shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.cfg"), scenarios / "battle.cfg")
    line = env_error("doom_battle", cfg)
    assert "battle.wad" in line and str(scenarios) in line
    text = (scenarios / "battle.cfg").read_text().replace("basic.wad", "battle.wad")
    (scenarios / "battle.cfg").write_text(text)
    shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.wad"), scenarios / "battle.wad")
    assert env_error("doom_battle", cfg) is None

    env = create_env("doom_battle", cfg)
    try:
        assert env.action_space == gym.spaces.Tuple([gym.spaces.Discrete(n) for n in (3, 3, 2, 2, 8, 21)])
        obs, _ = env.reset(seed=0)
        assert_observation(obs, env.observation_space)
        obs, reward, *_ = env.step(noop(env))
        assert_observation(obs, env.observation_space)
        assert measurement(obs, "HEALTH") == 100
    finally:
        env.close()


def test_match_names_and_defaults():
    for name in ("doom_duel", "doom_duel_bots", "doom_deathmatch_bots", "doom_deathmatch_full"):
        assert env_error(name) is None
        assert env_defaults(name) == {"env_frameskip": 2, "gamma": 0.995}
    # Battle is single-player: the Doom family's defaults, like every other scenario
    assert env_defaults("doom_battle") == {"env_frameskip": 4, "gamma": 0.99, **envs.DOOM.flag_defaults}
    assert "doom_duel" in env_error("doom_nope") and "doom_battle2" in env_error("doom_nope")


# ------------------------------------------------------------------------------------------------
# Failures
# ------------------------------------------------------------------------------------------------


def joiner_process(env) -> int:
    """pid of the vizdoom process of agent 1 (which joins agent 0's game) of a duel."""
    for pid in vizdoom_processes():
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"-join" in args and args[args.index(b"-port") + 1] == str(env.port).encode():
            return pid
    raise AssertionError("no vizdoom process joins this duel")


def test_a_crashed_player_fails_the_match(make_match):
    env = make_match("doom_duel", doom_match_minutes=1.0)
    env.reset()
    env.step([noop(env)] * 2)
    joiner = joiner_process(env)
    os.kill(joiner, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="agent 1 .*failed"):
        env.step([noop(env)] * 2)
    with pytest.raises(RuntimeError, match="failed earlier"):  # appo.py closes it and makes a new one
        env.reset()
    # the fixture checks that close() ends the host, which would otherwise wait for agent 1 forever


def test_a_stalled_player_times_out(make_match, monkeypatch):
    monkeypatch.setattr(envs, "DOOM_MATCH_TIMEOUT_S", 2.0)
    env = make_match("doom_duel", doom_match_minutes=1.0)
    env.reset()
    joiner = joiner_process(env)
    os.kill(joiner, signal.SIGSTOP)  # the host's next tic waits for it, and so would the step
    try:
        with pytest.raises(RuntimeError, match="did not answer within 2 s"):
            env.step([noop(env)] * 2)
    finally:
        if os.path.exists(f"/proc/{joiner}"):
            os.kill(joiner, signal.SIGCONT)
