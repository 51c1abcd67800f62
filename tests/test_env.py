"""env.py against real VizDoom and ALE games; DeepMind Lab against tests/fake_deepmind_lab.py
(deepmind_lab cannot be installed on this machine, see that file)."""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import env as envs
from conftest import vizdoom_processes
from env import create_env, env_defaults, env_error, get_num_agents, register_env


def flags(**values) -> argparse.Namespace:
    """A stand-in for appo.py's parsed flags."""
    return argparse.Namespace(**values)


def assert_matches_space(obs, space):
    """The observation is exactly what the space promises: shape, dtype, contiguous memory."""
    if isinstance(space, gym.spaces.Dict):
        assert set(obs) == set(space.spaces)
        for key, subspace in space.spaces.items():
            assert_matches_space(obs[key], subspace)
        return
    assert isinstance(obs, np.ndarray)
    assert obs.shape == space.shape and obs.dtype == space.dtype
    assert obs.flags.c_contiguous
    assert space.contains(obs)


# ------------------------------------------------------------------------------------------------
# VizDoom
# ------------------------------------------------------------------------------------------------


# Sample Factory's action spaces (sf_examples/vizdoom/doom/doom_utils.py); take_cover is ours.
DOOM_ACTION_SPACES = {
    "doom_basic": gym.spaces.Discrete(4),
    "doom_defend_the_center": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Discrete(2)]),
    "doom_defend_the_line": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Discrete(2)]),
    "doom_health_gathering": gym.spaces.Discrete(5),
    "doom_health_gathering_supreme": gym.spaces.Discrete(5),
    "doom_my_way_home": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Discrete(3)]),
    "doom_deadly_corridor": gym.spaces.Tuple([gym.spaces.Discrete(n) for n in (3, 3, 3, 2)]),
    "doom_take_cover": gym.spaces.Discrete(3),
}


@pytest.mark.parametrize("name", sorted(DOOM_ACTION_SPACES))
def test_doom_spaces_and_observations(make_doom, name):
    env = make_doom(name)
    assert env.action_space == DOOM_ACTION_SPACES[name]
    assert env.observation_space == gym.spaces.Box(0, 255, (3, 72, 128), np.uint8)
    assert get_num_agents(env) == 1

    obs, _ = env.reset(seed=1)
    assert_matches_space(obs, env.observation_space)
    env.action_space.seed(1)
    for _ in range(5):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert_matches_space(obs, env.observation_space)
        assert isinstance(reward, float)


def test_doom_buttons_follow_the_action_table(make_doom):
    env = make_doom("doom_deadly_corridor")
    game = env.unwrapped.game
    names = [button.name for button in game.get_available_buttons()]
    assert names == ["TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "ATTACK"]
    # (turn right, backward, no strafe, attack)
    assert env.unwrapped._buttons_for((2, 2, 0, 1)) == [0, 1, 0, 1, 0, 0, 1]


@pytest.mark.parametrize("frameskip", [4, 2])
def test_doom_frameskip_advances_the_game_by_frameskip_tics(make_doom, frameskip):
    env = make_doom("doom_health_gathering", env_frameskip=frameskip)
    game = env.unwrapped.game
    env.reset(seed=0)
    for _ in range(10):
        tic_before = game.get_episode_time()
        env.step(1)  # turn left: health gathering lasts far longer than 10 steps
        assert game.get_episode_time() - tic_before == frameskip


def test_doom_basic_reward_scale_and_true_return(make_doom):
    env = make_doom("doom_basic", seed=0)
    game = env.unwrapped.game
    env.reset()
    env.action_space.seed(0)
    training_rewards, infos = [], []
    while True:
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        training_rewards.append(reward)
        infos.append(info)
        if terminated or truncated:
            break

    unscaled_score = game.get_total_reward()  # VizDoom's own sum of the raw rewards
    assert unscaled_score != 0
    assert sum(training_rewards) * 100 == pytest.approx(unscaled_score)
    assert all(abs(r) < 2 for r in training_rewards)  # raw basic rewards reach 100
    assert all("true_return" not in info for info in infos[:-1])
    assert infos[-1]["true_return"] == pytest.approx(unscaled_score)
    assert infos[-1]["true_length"] == 4 * len(training_rewards)


def test_doom_seed_from_flags_and_reset(make_doom):
    # cfg.seed + env_index seeds the first reset; basic places its monster at random
    from_flags, _ = make_doom("doom_basic", seed=5, env_index=2).reset()
    from_reset, _ = make_doom("doom_basic").reset(seed=7)
    other_seed, _ = make_doom("doom_basic").reset(seed=8)
    assert np.array_equal(from_flags, from_reset)
    assert not np.array_equal(from_flags, other_seed)


def test_doom_game_variables_and_render(make_doom):
    env = make_doom("doom_health_gathering", render_mode="rgb_array", doom_game_variables=True)
    assert set(env.observation_space.spaces) == {"obs", "measurements"}
    assert env.observation_space["measurements"].shape == (1,)
    obs, _ = env.reset(seed=0)
    assert_matches_space(obs, env.observation_space)
    import vizdoom

    game = env.unwrapped.game
    health_at_start = obs["measurements"][0]
    assert health_at_start == pytest.approx(game.get_game_variable(vizdoom.GameVariable.HEALTH) / 100)
    assert 0.5 < health_at_start <= 1.0
    for _ in range(30):
        obs, *_ = env.step(0)
    assert obs["measurements"][0] < health_at_start  # the acid floor hurts
    frame = env.render()
    assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8  # full resolution, for videos


def test_doom_resize_nearest_picks_screen_pixels_and_area_averages_them(make_doom):
    """--doom_resize nearest: every pixel of the 128x72 frame is the screen pixel OpenCV's nearest
    rule names (Sample Factory's frames); area (the default) averages, so the frame keeps the
    screen's mean brightness but is not that subsample."""
    frames = {}
    for resize in ("nearest", "area"):
        env = make_doom("doom_basic", render_mode="rgb_array", doom_resize=resize)
        frames[resize], _ = env.reset(seed=0)
        screen = env.render()  # the 160x120 screen the frame was made from
    rows, columns = np.arange(72) * 120 // 72, np.arange(128) * 160 // 128
    subsample = screen[rows][:, columns].transpose(2, 0, 1)
    assert np.array_equal(frames["nearest"], subsample)
    assert not np.array_equal(frames["area"], subsample)
    assert abs(frames["area"].mean() - screen.mean()) < 1.0


def test_doom_basic_is_sample_factorys_task_with_its_status_bar(make_doom, tmp_path):
    """The package's basic.cfg hides the status bar; Sample Factory's copy shows it, and doom_basic
    is Sample Factory's task. The same .cfg from --doom_scenarios_dir is rendered as written."""
    import vizdoom

    scenarios = tmp_path / "maps"
    scenarios.mkdir()
    for filename in ("basic.cfg", "basic.wad"):
        shutil.copy(os.path.join(vizdoom.scenarios_path, filename), scenarios)
    as_sample_factory = make_doom("doom_basic", seed=3)
    as_written = make_doom("doom_basic", seed=3, doom_scenarios_dir=str(scenarios))
    as_sample_factory.reset()
    as_written.reset()
    for _ in range(3):
        as_sample_factory.step(0)
        as_written.step(0)
    with_hud = as_sample_factory.unwrapped.game.get_state().screen_buffer
    without_hud = as_written.unwrapped.game.get_state().screen_buffer
    # Doom's status bar is 32 of 200 rows: the bottom 16% of the 160x120 screen, grey, with red digits
    status_bar = slice(int(120 * 168 / 200), 120)
    assert (with_hud[status_bar, :, 0] > with_hud[status_bar, :, 2] + 60).sum() > 50  # the red ammo/health digits
    assert not np.array_equal(with_hud[:status_bar.start], without_hud[:status_bar.start])  # a smaller 3-D view


def test_doom_health_gathering_rewards_are_sample_factorys(make_doom):
    """Sample Factory's health_gathering: 0.01 a tic alive, no death penalty, +1 per health pickup
    in the training reward only; true_return is the game's own reward (0.01 x tics survived)."""
    env = make_doom("doom_health_gathering", seed=0)
    game = env.unwrapped.game
    env.reset()
    rng = np.random.default_rng(0)
    training_rewards = []
    while True:  # mostly forward (action 3), turning now and then: it runs into medikits
        _, reward, terminated, truncated, info = env.step(int(rng.choice(5, p=[0.0, 0.15, 0.15, 0.7, 0.0])))
        training_rewards.append(reward)
        if terminated or truncated:
            break
    pickups = [r for r in training_rewards if r > 0.5]
    assert pickups and all(r == pytest.approx(1.0 + 0.04) for r in pickups)  # a pickup during 4 tics alive
    assert info["true_return"] == pytest.approx(game.get_total_reward())
    assert info["true_return"] == pytest.approx(sum(training_rewards) - len(pickups))
    # no death penalty: the game's reward is 0.01 for each tic lived (up to the 2,100-tic time limit)
    assert 0 < info["true_return"] <= 21.0 + 1e-6
    assert info["true_return"] == pytest.approx(0.01 * (game.get_episode_time() - game.get_episode_start_time()),
                                                abs=0.05)


def test_doom_scenarios_dir(make_doom, tmp_path):
    import vizdoom

    scenarios = tmp_path / "maps"
    scenarios.mkdir()
    with pytest.raises(FileNotFoundError, match=r"basic\.cfg.*--doom_scenarios_dir"):
        create_env("doom_basic", flags(doom_scenarios_dir=str(scenarios)))

    shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.cfg"), scenarios)
    with pytest.raises(FileNotFoundError, match=r"basic\.wad.*--doom_scenarios_dir"):
        create_env("doom_basic", flags(doom_scenarios_dir=str(scenarios)))

    shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.wad"), scenarios)
    env = make_doom("doom_basic", doom_scenarios_dir=str(scenarios))
    assert env.unwrapped.game.get_doom_scenario_path() == str(scenarios / "basic.wad")


# ------------------------------------------------------------------------------------------------
# Atari
# ------------------------------------------------------------------------------------------------


def test_atari_observations_and_frame_stack():
    env = create_env("atari_breakout", flags(seed=0))
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        assert env.action_space == gym.spaces.Discrete(4)
        obs, _ = env.reset()
        assert_matches_space(obs, env.observation_space)
        assert all(np.array_equal(obs[0], frame) for frame in obs[1:])  # a new episode repeats its first frame

        env.action_space.seed(0)
        for _ in range(8):
            obs, *_ = env.step(env.action_space.sample())
        assert_matches_space(obs, env.observation_space)
        assert not np.array_equal(obs[-1], obs[0])  # the ball moves
    finally:
        env.close()


def test_atari_whole_game_stats_across_lives():
    """Space Invaders: 3 lives, invaders worth 5 to 30 points each."""
    env = create_env("atari_space_invaders", flags(seed=1))
    try:
        env.reset()
        assert env.unwrapped.ale.lives() == 3
        env.action_space.seed(1)
        training_episodes, clipped_sum = 0, 0.0
        for _ in range(20_000):
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert reward in (-1.0, 0.0, 1.0)
            clipped_sum += reward
            if terminated or truncated:
                training_episodes += 1
                if "true_return" in info:
                    break
                assert env.unwrapped.ale.lives() == 3 - training_episodes  # ended by a lost life
                env.reset()  # continues the same game
            else:
                assert "true_return" not in info
        else:
            pytest.fail("the game did not end")

        assert training_episodes == 3  # one training episode per life, one report per game
        assert clipped_sum > 0
        assert info["true_return"] >= 5 * clipped_sum  # unclipped points, summed over all lives
        assert info["true_return"] % 5 == 0
        assert info["true_length"] == info["episode_frame_number"]  # ALE's own frame count of the game
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------
# Names, errors, defaults, registration
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def no_deepmind_lab(monkeypatch):
    monkeypatch.delitem(sys.modules, "deepmind_lab", raising=False)
    if importlib.util.find_spec("deepmind_lab") is not None:
        pytest.skip("deepmind_lab is installed here")


def test_env_error_messages(no_deepmind_lab):
    assert env_error("doom_basic") is None
    assert env_error("atari_breakout") is None

    unknown = env_error("doom_foo")
    assert "unknown env 'doom_foo'" in unknown and "doom_basic" in unknown and "atari_<game>" in unknown
    with pytest.raises(ValueError, match="unknown env"):
        create_env("doom_foo")

    unknown_game = env_error("atari_notagame")
    assert "notagame" in unknown_game and "atari_breakout" in unknown_game
    with pytest.raises(ValueError, match="notagame"):
        create_env("atari_notagame")

    for name in ("dmlab_30", "dmlab_rooms_watermaze"):
        install_line = env_error(name)
        assert "deepmind_lab" in install_line and "github.com/google-deepmind/lab" in install_line
        assert "bazel" in install_line.lower() and "\n" not in install_line
        with pytest.raises(ImportError) as raised:
            create_env(name)
        assert str(raised.value) == install_line


def test_env_error_names_missing_package(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real_find_spec(name, *a)
    )
    monkeypatch.delitem(sys.modules, "ale_py", raising=False)
    assert env_error("atari_breakout") == "--env atari_breakout needs ale-py: pip install ale-py"


def test_env_defaults():
    expected = {"env_frameskip": 4, "gamma": 0.99}
    # one set per family: every single-player Doom scenario alike, every Atari game alike
    doom = env_defaults("doom_basic")
    assert all(env_defaults(name) == doom for name in ("doom_health_gathering", "doom_my_way_home", "doom_take_cover"))
    assert doom == {**expected, **envs.DOOM.flag_defaults}
    assert doom["batch_size"] == 512 and doom["normalize_input"] and not doom["with_vtrace"]
    assert env_defaults("atari_pong") == env_defaults("atari_breakout") == {**expected, **envs.ATARI.flag_defaults}
    # the published configurations they come from, value by value (a change must change this test)
    atari = env_defaults("atari_breakout")  # atari_params.py, CleanRL's ppo_atari.py for Adam's eps
    assert {key: atari[key] for key in ("rnn_type", "encoder", "rollout", "batch_size", "num_batches_per_epoch",
                                        "num_epochs", "learning_rate", "lr_schedule", "max_grad_norm", "adam_eps",
                                        "exploration_loss_coeff", "async_rl", "train_for_env_steps")} == {
        "rnn_type": "none", "encoder": "convnet_atari", "rollout": 128, "batch_size": 256, "num_batches_per_epoch": 4,
        "num_epochs": 4, "learning_rate": 2.5e-4, "lr_schedule": "linear_decay", "max_grad_norm": 0.5,
        "adam_eps": 1e-5, "exploration_loss_coeff": 0.01, "async_rl": False, "train_for_env_steps": 40_000_000}
    vectors = env_defaults("gym:CartPole-v1")  # mujoco_params.py
    assert {key: vectors[key] for key in ("encoder_mlp_layers", "nonlinearity", "rollout", "batch_size",
                                          "num_batches_per_epoch", "num_epochs", "learning_rate", "value_loss_coeff",
                                          "max_grad_norm", "train_for_env_steps")} == {
        "encoder_mlp_layers": [64, 64], "nonlinearity": "tanh", "rollout": 64, "batch_size": 256,
        "num_batches_per_epoch": 4, "num_epochs": 2, "learning_rate": 0.00295, "value_loss_coeff": 1.3,
        "max_grad_norm": 3.5, "train_for_env_steps": 10_000_000}
    assert env_defaults("doom_duel") == envs.DOOM_MATCH_DEFAULTS  # the matches keep their own
    assert env_defaults("dmlab_30") == {**expected, "encoder": "resnet"}
    assert env_defaults("no_such_env") == {}
    assert env_defaults("atari_notagame") == {}


def test_register_env(monkeypatch, no_deepmind_lab):
    monkeypatch.setattr(envs, "FAMILIES", list(envs.FAMILIES))  # registrations end with the test
    calls = []

    def factory(cfg, env_index, render_mode):
        calls.append((cfg, env_index, render_mode))
        return gym.make("CartPole-v1")

    # a registered name wins over the dmlab_ prefix (whose package is missing here)
    register_env("dmlab_my_level", factory)
    assert env_error("dmlab_my_level") is None
    cfg = flags(seed=1)
    env = create_env("dmlab_my_level", cfg, env_index=3, render_mode="rgb_array")
    assert calls == [(cfg, 3, "rgb_array")]
    assert get_num_agents(env) == 1
    assert env_defaults("dmlab_my_level") == envs.GYM_VECTOR_DEFAULTS  # it declared none: those of vectors
    assert calls[1:] == [(None, 0, None)]  # one env made with no flags to see what it observes
    assert "dmlab_my_level" in env_error("nope")
    env.close()


def test_a_registered_env_carries_its_own_defaults_and_check(monkeypatch):
    monkeypatch.setattr(envs, "FAMILIES", list(envs.FAMILIES))
    register_env("my_env", lambda cfg, env_index, render_mode: gym.make("CartPole-v1"),
                 flag_defaults={"batch_size": 256, "gamma": 0.9}, num_agents=1,
                 problem=lambda cfg: "my_env needs --seed" if getattr(cfg, "seed", None) is None else None)
    assert env_defaults("my_env") == {"batch_size": 256, "gamma": 0.9}
    assert envs.num_agents_of("my_env") == 1
    assert env_error("my_env", flags(seed=None)) == "my_env needs --seed" and env_error("my_env", flags(seed=3)) is None
    with pytest.raises(ValueError, match="needs --seed"):
        create_env("my_env", flags(seed=None))
    register_env("my_env", lambda cfg, env_index, render_mode: gym.make("CartPole-v1"))  # again: replaces it
    assert env_defaults("my_env") == envs.GYM_VECTOR_DEFAULTS and env_error("my_env", flags(seed=None)) is None
    assert sum(family.known == ("my_env",) for family in envs.FAMILIES) == 1


# ------------------------------------------------------------------------------------------------
# DeepMind Lab (against the stand-in)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_lab(monkeypatch):
    """Puts tests/fake_deepmind_lab.py into sys.modules as `deepmind_lab`; returns its Lab class."""
    spec = importlib.util.spec_from_file_location("deepmind_lab", Path(__file__).with_name("fake_deepmind_lab.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "deepmind_lab", module)
    return module.Lab


# The IMPALA action set: (look left/right, look down/up, strafe, back/forward, fire, jump, crouch)
IMPALA_ACTIONS = [
    [0, 0, 0, 1, 0, 0, 0],  # forward
    [0, 0, 0, -1, 0, 0, 0],  # backward
    [0, 0, -1, 0, 0, 0, 0],  # strafe left
    [0, 0, 1, 0, 0, 0, 0],  # strafe right
    [-20, 0, 0, 0, 0, 0, 0],  # look left
    [20, 0, 0, 0, 0, 0, 0],  # look right
    [-20, 0, 0, 1, 0, 0, 0],  # look left + forward
    [20, 0, 0, 1, 0, 0, 0],  # look right + forward
    [0, 0, 0, 0, 1, 0, 0],  # fire
]


def test_dmlab_observations_frameskip_and_actions(fake_lab):
    assert env_error("dmlab_rooms_watermaze") is None
    env = create_env("dmlab_rooms_watermaze")
    lab = fake_lab.created[-1]
    assert lab.level == "contributed/dmlab30/rooms_watermaze"
    assert (lab.width, lab.height) == (96, 72)
    assert env.observation_space == gym.spaces.Box(0, 255, (3, 72, 96), np.uint8)
    assert env.action_space == gym.spaces.Discrete(9)
    assert get_num_agents(env) == 1

    obs, _ = env.reset()
    assert_matches_space(obs, env.observation_space)
    for action in range(9):
        obs, *_ = env.step(action)
        assert_matches_space(obs, env.observation_space)
    assert [list(sent) for sent, _ in lab.step_calls] == IMPALA_ACTIONS
    assert all(num_steps == 4 for _, num_steps in lab.step_calls)
    assert obs[0, 0, 0] == 9 * 4  # the stand-in paints the number of frames played
    env.close()
    assert lab.closed


def test_dmlab_frameskip_flag_and_plain_level_names(fake_lab):
    env = create_env("dmlab_nav_maze_static_01", flags(env_frameskip=2))
    lab = fake_lab.created[-1]
    assert lab.level == "nav_maze_static_01"  # not a DMLab-30 level: passed on as given
    env.reset()
    env.step(0)
    assert lab.step_calls[-1][1] == 2


def test_dmlab_episode_end_and_true_return(fake_lab):
    env = create_env("dmlab_rooms_watermaze")
    env.reset()
    infos = []
    for _ in range(100):
        obs, reward, terminated, truncated, info = env.step(0)  # forward: 1 per frame in the stand-in
        assert reward == 4.0
        infos.append(info)
        if terminated or truncated:
            break
    assert terminated and not truncated
    assert len(infos) == 10  # the stand-in's 40-frame episode at frameskip 4
    assert_matches_space(obs, env.observation_space)
    assert all("true_return" not in info for info in infos[:-1])
    assert infos[-1]["true_return"] == 40.0 and infos[-1]["true_length"] == 40
    assert "level_name" not in infos[-1]

    env.reset()  # a new episode starts
    _, _, terminated, _, info = env.step(8)
    assert not terminated and "true_return" not in info


@pytest.mark.parametrize("env_index", [0, 1, 29, 30, 61])
def test_dmlab30_spreads_levels_over_envs(fake_lab, env_index):
    level = envs.DMLAB30_LEVELS[env_index % 30]
    env = create_env("dmlab_30", env_index=env_index)
    assert fake_lab.created[-1].level == "contributed/dmlab30/" + level
    env.reset()
    terminated = False
    while not terminated:
        _, _, terminated, _, info = env.step(1)
    assert info["level_name"] == level
    assert info["true_return"] == 0.0


def test_dmlab30_level_list():
    levels = envs.DMLAB30_LEVELS
    assert len(levels) == len(set(levels)) == 30
    assert "rooms_collect_good_objects_train" in levels  # training names, not the held-out *_test ones
    assert "rooms_exploit_deferred_effects_train" in levels
    assert not any(level.endswith("_test") for level in levels)


def test_dmlab_level_cache(fake_lab, tmp_path):
    cache_dir = tmp_path / "level_cache"
    create_env("dmlab_rooms_watermaze", flags(dmlab_level_cache_dir=str(cache_dir)))
    assert fake_lab.created[-1].level_cache_hit is False  # compiled, then written to the cache
    assert [path.name for path in cache_dir.iterdir()] == ["contributed_dmlab30_rooms_watermaze.pk3"]
    create_env("dmlab_rooms_watermaze", flags(dmlab_level_cache_dir=str(cache_dir)))
    assert fake_lab.created[-1].level_cache_hit is True


def test_dmlab_seeds(fake_lab):
    def lab_seeds(cfg, env_index):
        env = create_env("dmlab_30", cfg, env_index=env_index)
        env.reset()
        env.reset()
        return fake_lab.created[-1].reset_seeds

    assert lab_seeds(flags(seed=3), 1) == lab_seeds(flags(seed=2), 2)  # seed + env_index
    assert lab_seeds(flags(seed=3), 1) != lab_seeds(flags(seed=3), 2)
    assert len(set(lab_seeds(flags(seed=3), 1))) == 2  # each episode gets its own seed


def dmlab30_human_normalized_score(level_returns: dict[str, float]) -> float:
    """Mean over the 30 levels of the human-normalised score in percent, each capped at 100 (the
    IMPALA paper's DMLab-30 figure, from env.py's DMLAB30_SCORES; no run computes it, so it lives here).

    `level_returns` maps DMLab-30 training level names (as in info["level_name"]) to mean
    episode returns. Other names are ignored; a missing DMLab-30 level raises ValueError.
    """
    missing = [level for level in envs.DMLAB30_LEVELS if level not in level_returns]
    if missing:
        raise ValueError(f"DMLab-30 score needs returns for all 30 levels; missing: {', '.join(missing)}")
    scores = []
    for level in envs.DMLAB30_LEVELS:
        human, random = envs.DMLAB30_SCORES[level]
        score = 100.0 * (level_returns[level] - random) / (human - random)
        scores.append(min(score, 100.0))
    return float(np.mean(scores))


def test_dmlab30_human_normalized_score():
    returns = {level: random for level, (human, random) in envs.DMLAB30_SCORES.items()}  # 0 each
    returns["rooms_watermaze"] = 54.0  # human score: 100
    returns["lasertag_one_opponent_small"] = 100.0  # far above human: capped at 100
    returns["explore_goal_locations_small"] = (267.5 + 7.66) / 2  # halfway: 50
    returns["rooms_collect_good_objects_train"] = 0.073 + 0.25 * (10 - 0.073)  # scored as its _test twin: 25
    returns["not_a_dmlab30_level"] = 1e6  # ignored
    assert dmlab30_human_normalized_score(returns) == pytest.approx((100 + 100 + 50 + 25) / 30)

    del returns["rooms_watermaze"]
    with pytest.raises(ValueError, match="rooms_watermaze"):
        dmlab30_human_normalized_score(returns)


# ---------------------------------------------------------------------------------------------
# gym:<id>

def test_a_gymnasium_env_by_id_reports_whole_games():
    env = create_env("gym:CartPole-v1", flags(seed=3, env_frameskip=1))
    assert env.observation_space == gym.spaces.Box(env.observation_space.low, env.observation_space.high,
                                                   (4,), np.float32)
    obs, _ = env.reset()
    assert_matches_space(obs, env.observation_space)
    total, steps, info = 0.0, 0, {}
    while "true_return" not in info:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            obs, _ = env.reset()
    assert info["true_return"] == total and info["true_length"] == steps  # one frame per step
    env.close()


class ImageAndVector(gym.Env):
    """A registered env with HWC image and float64 vector observations, and a Box action."""
    observation_space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (6, 8, 3), np.uint8),
                                         "state": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float64)})
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action)
        return self.observation_space.sample(), 1.0, True, False, {}


def test_gym_observations_become_chw_images_and_float32_vectors():
    gym.register("AppoTest/ImageAndVector-v0", entry_point=ImageAndVector)
    env = create_env("gym:AppoTest/ImageAndVector-v0", flags(env_frameskip=1))
    assert env.observation_space["pixels"].shape == (3, 6, 8)
    assert env.observation_space["state"] == gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=1)
    assert_matches_space(obs, env.observation_space)
    env.close()
    raw = {"pixels": np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3), "state": np.ones((2, 2))}
    converted = envs.GymObservations(ImageAndVector()).observation(raw)
    assert np.array_equal(converted["pixels"], raw["pixels"].transpose(2, 0, 1))
    assert converted["state"].dtype == np.float32 and converted["state"].shape == (4,)


def test_a_gym_envs_video_plays_at_its_own_rate():
    assert envs.game_fps("gym:CartPole-v1") == 50.0  # CartPoleEnv.metadata["render_fps"]


def test_gym_names_that_cannot_work_are_flag_errors():
    assert "did you mean CartPole-v1" in env_error("gym:CartPol-v1")
    assert "--env_frameskip 4" in env_error("gym:CartPole-v1", flags(env_frameskip=4))
    assert env_error("gym:CartPole-v1", flags(env_frameskip=1)) is None
    assert env_defaults("gym:CartPole-v1")["env_frameskip"] == 1


def test_a_gym_env_gets_the_defaults_of_what_it_observes():
    """Vectors: Sample Factory's continuous-control configuration (an MLP with tanh, synchronous);
    images: appo.py's own, Sample Factory's configuration for pixels (conv encoder, GRU,
    asynchronous). Before, every gym: id got the MLP family's, images too."""
    assert env_defaults("gym:CartPole-v1") == envs.GYM_VECTOR_DEFAULTS
    pixels = env_defaults("gym:ale_py:ALE/Pong-v5")  # ale_py registers its ids when imported
    assert pixels == envs.GYM_IMAGE_DEFAULTS and "encoder_mlp_layers" not in pixels and "async_rl" not in pixels


def test_a_registered_env_without_defaults_gets_those_of_what_it_observes(monkeypatch):
    monkeypatch.setattr(envs, "FAMILIES", list(envs.FAMILIES))
    register_env("my_pixels", lambda cfg, env_index, render_mode: envs.create_env("gym:ale_py:ALE/Pong-v5", cfg))
    register_env("my_vectors", lambda cfg, env_index, render_mode: gym.make("CartPole-v1"))
    register_env("needs_flags", lambda cfg, env_index, render_mode: gym.make(cfg.my_id))
    assert env_defaults("my_pixels") == {}  # appo.py's own: conv encoder, GRU, asynchronous
    assert env_defaults("my_vectors") == envs.GYM_VECTOR_DEFAULTS
    assert env_defaults("needs_flags") == {}  # cannot be made without its flags: appo.py's own


KILL_THE_GAME = """
import os, sys, threading, time
import env as envs
from conftest import vizdoom_processes

def kill_the_game():  # the first game process this process starts, as soon as it exists
    while not (games := vizdoom_processes()):
        time.sleep(0.001)
    (pid, instance_id), = games.items()
    print(instance_id, flush=True)
    os.kill(pid, 9)

starting = sys.argv[1] == "starting"
game = None if starting else envs.create_env("doom_basic")
killer = threading.Thread(target=kill_the_game)
killer.start()
if not starting:
    killer.join()
try:
    envs.create_env("doom_basic") if starting else game.step(0)
except Exception as error:
    print(type(error).__name__, flush=True)
"""


def test_vizdoom_segfaults_its_host_when_its_game_process_dies_while_starting(tmp_path):
    """Why bench/chaos.py allows a rollout worker restart for a game process it kills while the
    game starts: VizDoom 1.3's DoomController::init reads its game state before it has opened the
    game's shared memory when the game dies then, and the host process segfaults (docs/faults.md).
    A game killed once started raises instead, and the rollout worker recreates the env. If the
    first half fails, VizDoom fixed its init: drop the allowance."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for when, expected_code, raised in (("starting", -11, False), ("started", 0, True)):
        result = subprocess.run([sys.executable, "-c", KILL_THE_GAME, when], capture_output=True, text=True,
                                timeout=120, cwd=tmp_path,
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.path.join(repo, "tests")])))
        instance_id, *rest = result.stdout.split()
        for path in Path("/dev/shm").glob(f"ViZDoom*{instance_id}"):  # a killed game and a dead host free nothing
            path.unlink()
        assert result.returncode == expected_code, (when, result.returncode, result.stdout, result.stderr[-2000:])
        assert (rest[0].startswith("ViZDoom") if raised else rest == []), (when, result.stdout)  # its exception


def test_vizdoom_segments_that_no_game_names_are_orphans_once_old_enough():
    """What a rollout worker killed inside VizDoom's init leaves (the chaos run once left a
    ViZDoomMQDoom<id> of a game that never started): no process names it, so no kill finds it."""
    old, fresh = "/dev/shm/ViZDoomMQDoomtestOrphanOld", "/dev/shm/ViZDoomMQDoomtestOrphanNew"
    for path in (old, fresh):
        open(path, "w").close()
    env = create_env("doom_basic", flags(seed=1))
    try:
        game_pids = vizdoom_processes()
        live = envs.shared_memory_of(list(game_pids))
        assert len(live) == 3 and all(os.path.exists(path) for path in live)
        # the ages are set once the game runs: its start took over 5 s on a loaded machine, which
        # made `fresh` old enough to count (two tests at a time beside a training, 2026-12-03)
        for path in (old, *live):  # a running game's own, however old, are not orphans
            os.utime(path, (time.time() - 60, time.time() - 60))
        os.utime(fresh)
        orphans = envs.orphaned_shared_memory(older_than_s=30.0)
        assert old in orphans and fresh not in orphans and not set(live) & set(orphans)
    finally:
        env.close()
        for path in (old, fresh):
            os.unlink(path)
