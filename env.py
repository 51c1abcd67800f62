"""Environments for appo.py: VizDoom (doom_*), Atari (atari_<game>) and DeepMind Lab (dmlab_*).

    env = create_env("doom_basic", cfg, env_index=3)

Every env returned here speaks the Gymnasium API and follows one contract:
  * observations are uint8 CHW images (or a Dict {"obs": image, "measurements": float32 vector});
  * actions are Discrete or a Tuple of Discretes;
  * the reward is the one the learner trains on (Doom: scaled; Atari: clipped to its sign);
  * when a real game ends, the step's info holds "true_return" (raw score of the whole game) and
    "true_length" (env frames of the whole game, frameskip included); dmlab_30 adds "level_name".

The last point is done by two wrappers: GameStatsRecorder sits innermost, below every wrapper
that changes rewards or episode boundaries, and TrainerInterface, the outermost, hands its report
out on the next step() (so a game that ends inside a reset() is still reported).

Add your own env with register_env(name, factory).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

try:
    import cv2  # resizes Doom and Atari frames; DMLab renders at the training size
except ImportError:  # env_error() tells the user how to install it
    cv2 = None

# The defaults appo.py takes for every built-in env family (see env_defaults).
DEFAULT_FRAMESKIP = 4
DEFAULT_GAMMA = 0.99


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------

EnvFactory = Callable[[object, int, "str | None"], gym.Env]

_REGISTERED_ENVS: dict[str, EnvFactory] = {}


def register_env(name: str, factory: EnvFactory) -> None:
    """Make `create_env(name, ...)` call `factory(cfg, env_index, render_mode)`.

    Registered names win over the built-in doom_/atari_/dmlab_ families.
    """
    _REGISTERED_ENVS[name] = factory


def create_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    """Build env `name` for the env with global index `env_index` among all envs of the run."""
    if name in _REGISTERED_ENVS:
        return _REGISTERED_ENVS[name](cfg, env_index, render_mode)

    problem = _env_problem(name)
    if problem is not None:
        exception_type, message = problem
        raise exception_type(message)

    if name.startswith("doom_"):
        return make_doom_env(name, cfg, env_index, render_mode)
    if name.startswith("atari_"):
        return make_atari_env(name, cfg, env_index, render_mode)
    return make_dmlab_env(name, cfg, env_index, render_mode)


# Per-env overrides of appo.py's defaults, on top of the family's frameskip and gamma.
# doom_basic is solved in a few hundred thousand frames: the paper's batch of 2048 would give too
# few SGD steps in that budget, so it trains on smaller batches, as Sample Factory's examples do.
# Per-pixel input normalisation makes the small monster stand out from the static room; without it
# the return stayed flat for 500k frames, with it the return started climbing around 400k.
ENV_FLAG_OVERRIDES: dict[str, dict] = {
    "doom_basic": {"batch_size": 512, "normalize_input": True},
}


def env_defaults(name: str) -> dict:
    """Per-env defaults for appo.py flags (env_frameskip, gamma, and ENV_FLAG_OVERRIDES); {} for
    unknown names.

    Registered envs get {} too: appo.py's own defaults apply to them.
    """
    if name in _REGISTERED_ENVS:
        return {}
    problem = _env_problem(name)
    if problem is not None and problem[0] is ValueError:  # an unknown name, not a missing package
        return {}
    return {"env_frameskip": DEFAULT_FRAMESKIP, "gamma": DEFAULT_GAMMA, **ENV_FLAG_OVERRIDES.get(name, {})}


def env_error(name: str) -> str | None:
    """None if `name` can be created here; otherwise one line naming the problem and the fix."""
    problem = _env_problem(name)
    return None if problem is None else problem[1]


def game_fps(name: str) -> float:
    """Frames per second of the game itself (videos play at game speed: this / frameskip)."""
    if name.startswith("doom_"):
        return 35.0  # Doom's tic rate
    return 60.0  # Atari and DeepMind Lab


def shared_memory_of(pids: list[int]) -> list[str]:
    """/dev/shm files that env processes among `pids` created and only remove on a clean exit.

    The trainer kills a failed rollout worker together with its env processes, then unlinks these.
    VizDoom names its segments after the `+viz_instance_id` on the game process's command line.
    """
    paths = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "+viz_instance_id" in args[:-1]:
            instance_id = args[args.index("+viz_instance_id") + 1]
            paths += [f"/dev/shm/ViZDoom{kind}{instance_id}" for kind in ("SM", "MQCtr", "MQDoom")]
    return paths


def get_num_agents(env: gym.Env) -> int:
    """Number of agents acting in `env` (1 unless the env says otherwise)."""
    num_agents = getattr(env, "num_agents", None)
    if num_agents is None:
        num_agents = getattr(env.unwrapped, "num_agents", 1)
    return int(num_agents)


def _env_problem(name: str) -> tuple[type[Exception], str] | None:
    """(exception type, one-line message) describing why `name` cannot be created, or None."""
    if name in _REGISTERED_ENVS:
        return None
    if name in DOOM_SCENARIOS:
        return _missing_packages(name, [("vizdoom", "vizdoom"), ("cv2", "opencv-python-headless")])
    if _is_atari_name(name):
        missing = _missing_packages(name, [("ale_py", "ale-py"), ("cv2", "opencv-python-headless")])
        return missing or _unknown_atari_game(name)
    if _is_dmlab_name(name):
        if not _module_available("deepmind_lab"):
            return ImportError, _dmlab_install_line(name)
        return None
    return ValueError, _unknown_env_line(name)


def _module_available(module_name: str) -> bool:
    # find_spec does not import the (heavy) module; sys.modules covers stand-ins put there by tests
    return module_name in sys.modules or importlib.util.find_spec(module_name) is not None


def _missing_packages(env_name: str, modules_and_packages) -> tuple[type[Exception], str] | None:
    for module_name, pip_name in modules_and_packages:
        if not _module_available(module_name):
            return ImportError, f"--env {env_name} needs {pip_name}: pip install {pip_name}"
    return None


def _unknown_env_line(name: str) -> str:
    known = sorted(DOOM_SCENARIOS) + ["atari_<game> (any ALE game)", "dmlab_<level>", "dmlab_30"]
    known += sorted(_REGISTERED_ENVS)
    return f"unknown env {name!r} (--env): known envs are {', '.join(known)}"


# ------------------------------------------------------------------------------------------------
# Game statistics: the unscaled score and length of whole games
# ------------------------------------------------------------------------------------------------


class GameStatsRecorder(gym.Wrapper):
    """Innermost wrapper: adds up the raw reward and the frames of each real game.

    It must sit below every wrapper that scales or clips rewards or ends training episodes early
    (Atari episodic life), so that what it sees ending is a whole game. Each step counts
    `frames_per_step` frames (the last step of a game may really have been cut short; like
    Sample Factory, we count frames as steps x frameskip). When a game ends, the report waits in
    pop_report() for TrainerInterface.
    """

    def __init__(self, env: gym.Env, frames_per_step: int, extra_stats: dict | None = None):
        super().__init__(env)
        self._frames_per_step = frames_per_step
        self._extra_stats = dict(extra_stats or {})  # e.g. the dmlab_30 level name
        self._game_return = 0.0
        self._game_length = 0
        self._unreported: dict | None = None

    def reset(self, **kwargs):
        self._game_return, self._game_length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_return += float(reward)
        self._game_length += self._frames_per_step
        if terminated or truncated:
            self._unreported = {
                "true_return": self._game_return,
                "true_length": self._game_length,
                **self._extra_stats,
            }
        return obs, reward, terminated, truncated, info

    @property
    def game_return(self) -> float:
        """The raw score of the game so far (evaluation shows it on its video)."""
        return self._game_return

    def pop_report(self) -> dict | None:
        """The stats of the game that ended since the last call, or None."""
        report, self._unreported = self._unreported, None
        return report


class TrainerInterface(gym.Wrapper):
    """Outermost wrapper: what appo.py sees.

    - num_agents = 1 (multi-agent envs set their own);
    - puts the recorder's game report into the info of the next step() (a game can also end
      inside a reset(), e.g. Atari's no-op or FIRE steps; its report then goes out one step late
      rather than being lost);
    - applies the run's seed (cfg.seed + env_index) on the first reset() that passes none.
    """

    num_agents = 1

    def __init__(self, env: gym.Env, stats: GameStatsRecorder, seed: int | None):
        super().__init__(env)
        self._stats = stats
        self._first_seed = seed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self._first_seed
        self._first_seed = None
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        report = self._stats.pop_report()
        if report is not None:
            info.update(report)
        return obs, reward, terminated, truncated, info


def _run_seed(cfg, env_index: int) -> int | None:
    """Seed of this env: cfg.seed + env_index, or None (random) when the run has no seed."""
    seed = getattr(cfg, "seed", None)
    return None if seed is None else int(seed) + env_index


def _frameskip(cfg) -> int:
    frameskip = getattr(cfg, "env_frameskip", None)
    return DEFAULT_FRAMESKIP if frameskip is None else int(frameskip)


class ScaleReward(gym.RewardWrapper):
    """Multiplies the training reward by a constant (Doom scores can be in the hundreds)."""

    def __init__(self, env: gym.Env, scale: float):
        super().__init__(env)
        self._scale = scale

    def reward(self, reward):
        return float(reward) * self._scale


class ClipRewardToSign(gym.RewardWrapper):
    """Atari: train on the sign of the reward, so that every game has rewards of the same size."""

    def reward(self, reward):
        return float(np.sign(reward))


# ------------------------------------------------------------------------------------------------
# VizDoom
# ------------------------------------------------------------------------------------------------

DOOM_SCREEN_WIDTH, DOOM_SCREEN_HEIGHT = 128, 72  # what the model sees (rendered at 160x120)
DOOM_GAME_VARIABLE_SCALE = 100.0  # health, armour and ammo of these scenarios stay within [0, 200]


def _one_of(*buttons: str) -> tuple[tuple[str, ...], ...]:
    """An action head: option 0 presses nothing, option i presses buttons[i - 1]."""
    return ((),) + tuple((button,) for button in buttons)


@dataclass(frozen=True)
class DoomScenario:
    cfg_file: str
    # One entry per action head; each head lists, per option, the buttons that option holds down.
    # A single head gives a Discrete action space, several a Tuple of Discretes.
    action_heads: tuple[tuple[tuple[str, ...], ...], ...]
    reward_scale: float
    # Game variables given to the model when cfg.doom_game_variables is set.
    game_variables: tuple[str, ...]

    @property
    def buttons(self) -> list[str]:
        """Every button the heads use, each once, in order of first use."""
        ordered = []
        for head in self.action_heads:
            for option in head:
                ordered += [button for button in option if button not in ordered]
        return ordered


# Action spaces and reward scales as in Sample Factory's doom_utils.py. The buttons are set here
# rather than taken from the .cfg, so that the action table below is the only truth about them.
DOOM_SCENARIOS: dict[str, DoomScenario] = {
    "doom_basic": DoomScenario(
        "basic.cfg",
        (_one_of("MOVE_LEFT", "MOVE_RIGHT", "ATTACK"),),
        reward_scale=0.01,
        game_variables=("AMMO2",),
    ),
    "doom_defend_the_center": DoomScenario(
        "defend_the_center.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("ATTACK")),
        reward_scale=1.0,
        game_variables=("AMMO2", "HEALTH"),
    ),
    "doom_defend_the_line": DoomScenario(
        "defend_the_line.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("ATTACK")),
        reward_scale=1.0,
        game_variables=("AMMO2", "HEALTH"),
    ),
    "doom_health_gathering": DoomScenario(
        "health_gathering.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
    ),
    "doom_health_gathering_supreme": DoomScenario(
        "health_gathering_supreme.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
    ),
    "doom_my_way_home": DoomScenario(
        "my_way_home.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("MOVE_FORWARD", "MOVE_BACKWARD")),
        reward_scale=1.0,
        # the scenario declares no variables; health keeps the measurement vector non-empty
        game_variables=("HEALTH",),
    ),
    "doom_deadly_corridor": DoomScenario(
        "deadly_corridor.cfg",
        (
            _one_of("TURN_LEFT", "TURN_RIGHT"),
            _one_of("MOVE_FORWARD", "MOVE_BACKWARD"),
            _one_of("MOVE_LEFT", "MOVE_RIGHT"),
            _one_of("ATTACK"),
        ),
        reward_scale=0.01,
        game_variables=("HEALTH",),
    ),
    # not in Sample Factory's list: dodge left or right, reward 1 per tic alive
    "doom_take_cover": DoomScenario(
        "take_cover.cfg",
        (_one_of("MOVE_LEFT", "MOVE_RIGHT"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
    ),
}


def make_doom_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    scenario = DOOM_SCENARIOS[name]
    cfg_path = _doom_scenario_file(scenario.cfg_file, getattr(cfg, "doom_scenarios_dir", None))
    env = DoomEnv(
        scenario,
        cfg_path,
        frameskip=_frameskip(cfg),
        with_game_variables=bool(getattr(cfg, "doom_game_variables", False)),
        render_mode=render_mode,
    )
    stats = env = GameStatsRecorder(env, frames_per_step=env.frameskip)
    if scenario.reward_scale != 1.0:
        env = ScaleReward(env, scenario.reward_scale)
    return TrainerInterface(env, stats, seed=_run_seed(cfg, env_index))


def _doom_scenario_file(filename: str, scenarios_dir: str | None) -> str:
    """Path of a scenario file: from --doom_scenarios_dir when given, else from the vizdoom package."""
    if scenarios_dir is None:
        import vizdoom

        return os.path.join(vizdoom.scenarios_path, filename)
    path = os.path.join(scenarios_dir, filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Doom scenario file {path} not found (looked there because of --doom_scenarios_dir)")
    return path


class DoomEnv(gym.Env):
    """One single-player VizDoom game: renders 160x120 RGB, returns 128x72 CHW frames."""

    metadata = {"render_modes": ["rgb_array"]}
    num_agents = 1

    def __init__(
        self,
        scenario: DoomScenario,
        cfg_path: str,
        frameskip: int = DEFAULT_FRAMESKIP,
        with_game_variables: bool = False,
        render_mode: str | None = None,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"Doom envs support render_mode None or 'rgb_array', not {render_mode!r}")
        self.render_mode = render_mode
        self.frameskip = frameskip
        self._with_game_variables = with_game_variables
        self._button_table = _doom_button_table(scenario)
        self.game = _start_doom_game(scenario, cfg_path)

        self.action_space = _doom_action_space(scenario)
        image_space = spaces.Box(0, 255, (3, DOOM_SCREEN_HEIGHT, DOOM_SCREEN_WIDTH), dtype=np.uint8)
        if with_game_variables:
            measurements = spaces.Box(-np.inf, np.inf, (len(scenario.game_variables),), dtype=np.float32)
            self.observation_space = spaces.Dict({"obs": image_space, "measurements": measurements})
        else:
            self.observation_space = image_space

        self._last_screen = None  # full-resolution HWC frame, for render()
        self._last_obs = None  # returned again on the step that ends the episode (no state then)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.game.set_seed(seed % 2**32)  # takes effect at new_episode; Doom seeds are 32-bit
        self.game.new_episode()
        return self._observe(), {}

    def step(self, action):
        # VizDoom runs `frameskip` tics without rendering the ones in between (the fast path)
        reward = self.game.make_action(self._buttons_for(action), self.frameskip)
        finished = self.game.is_episode_finished()
        obs = self._last_obs if finished else self._observe()
        truncated = finished and self._timed_out()
        return obs, float(reward), finished and not truncated, truncated, {}

    def render(self):
        if self.render_mode == "rgb_array":
            return self._last_screen
        return None

    def close(self):
        if self.game is not None:
            self.game.close()  # ends the vizdoom process and frees its shared memory
            self.game = None

    def _buttons_for(self, action) -> list:
        heads = (action,) if len(self._button_table) == 1 else action
        pressed = sum(table[int(option)] for table, option in zip(self._button_table, heads))
        return pressed.tolist()

    def _observe(self):
        state = self.game.get_state()
        self._last_screen = state.screen_buffer
        resized = cv2.resize(state.screen_buffer, (DOOM_SCREEN_WIDTH, DOOM_SCREEN_HEIGHT), interpolation=cv2.INTER_AREA)
        image = np.ascontiguousarray(resized.transpose(2, 0, 1))
        if self._with_game_variables:
            measurements = np.asarray(state.game_variables, dtype=np.float32) / DOOM_GAME_VARIABLE_SCALE
            self._last_obs = {"obs": image, "measurements": measurements}
        else:
            self._last_obs = image
        return self._last_obs

    def _timed_out(self) -> bool:
        # the episode clock starts after the scenario's start tics
        timeout = self.game.get_episode_timeout()
        if timeout <= 0 or self.game.is_player_dead():
            return False
        return self.game.get_episode_time() >= self.game.get_episode_start_time() + timeout


def _doom_action_space(scenario: DoomScenario) -> spaces.Space:
    heads = [spaces.Discrete(len(head)) for head in scenario.action_heads]
    return heads[0] if len(heads) == 1 else spaces.Tuple(heads)


def _doom_button_table(scenario: DoomScenario) -> list[np.ndarray]:
    """Per head, a (num_options, num_buttons) 0/1 array; summing rows over heads gives the buttons."""
    buttons = scenario.buttons
    tables = []
    for head in scenario.action_heads:
        table = np.zeros((len(head), len(buttons)), dtype=np.float64)
        for option, pressed in enumerate(head):
            for button in pressed:
                table[option, buttons.index(button)] = 1.0
        tables.append(table)
    return tables


def _start_doom_game(scenario: DoomScenario, cfg_path: str):
    import vizdoom as vzd

    game = vzd.DoomGame()
    game.load_config(cfg_path)
    wad_path = game.get_doom_scenario_path()  # resolved relative to the .cfg
    if wad_path and not os.path.isfile(wad_path):
        raise FileNotFoundError(f"Doom scenario file {wad_path} (named in {cfg_path}) not found; check --doom_scenarios_dir")
    game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    game.set_screen_format(vzd.ScreenFormat.RGB24)
    game.set_window_visible(False)
    game.set_mode(vzd.Mode.PLAYER)  # synchronous: the game waits for our actions
    game.set_available_buttons([getattr(vzd.Button, button) for button in scenario.buttons])
    game.set_available_game_variables([getattr(vzd.GameVariable, var) for var in scenario.game_variables])
    # VizDoom writes its settings file into the working directory unless told otherwise
    game.set_doom_config_path(os.path.join(tempfile.gettempdir(), "appo_vizdoom.ini"))
    game.init()
    return game


# ------------------------------------------------------------------------------------------------
# Atari (ALE)
# ------------------------------------------------------------------------------------------------

ATARI_SIZE = 84
ATARI_FRAME_STACK = 4
ATARI_MAX_NOOPS = 30


def _is_atari_name(name: str) -> bool:
    return name.startswith("atari_") and len(name) > len("atari_")


def _atari_game(name: str) -> str:
    """atari_space_invaders -> space_invaders (an ALE rom id)."""
    return name[len("atari_"):]


def _ale_env_id(name: str) -> str:
    """atari_space_invaders -> ALE/SpaceInvaders-v5 (registers the ALE envs with Gymnasium)."""
    import ale_py
    from ale_py.registration import rom_id_to_name

    gym.register_envs(ale_py)
    return f"ALE/{rom_id_to_name(_atari_game(name))}-v5"


def _unknown_atari_game(name: str) -> tuple[type[Exception], str] | None:
    # ALE registers one env per single-player ROM (ale_py.roms.get_all_rom_ids() minus 2-player ones)
    if _ale_env_id(name) in gym.registry:
        return None
    return ValueError, (
        f"unknown Atari game {_atari_game(name)!r} in --env {name}: use atari_<rom id> for a "
        f"single-player rom id of ale_py.roms.get_all_rom_ids(), e.g. atari_breakout, atari_pong, atari_space_invaders"
    )


def make_atari_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    """The DQN-style Atari stack: 30 no-ops, max-and-skip, episodic life, FIRE, 84x84 grey, 4 frames."""
    env = gym.make(
        _ale_env_id(name),
        obs_type="grayscale",
        frameskip=1,  # MaxAndSkip below does the skipping, so that it can max over the last 2 frames
        repeat_action_probability=0.0,
        full_action_space=False,
        render_mode=render_mode,
    )
    stats = env = GameStatsRecorder(env, frames_per_step=1)
    env = NoopReset(env, ATARI_MAX_NOOPS)
    env = MaxAndSkip(env, _frameskip(cfg))
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = ResizeFrame(env, ATARI_SIZE)
    env = FrameStack(env, ATARI_FRAME_STACK)
    env = ClipRewardToSign(env)
    return TrainerInterface(env, stats, seed=_run_seed(cfg, env_index))


class NoopReset(gym.Wrapper):
    """Starts each game with 1..max_noops no-op frames, so that games do not all start alike."""

    NOOP = 0

    def __init__(self, env: gym.Env, max_noops: int):
        super().__init__(env)
        assert env.unwrapped.get_action_meanings()[self.NOOP] == "NOOP"
        self._max_noops = max_noops

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.np_random.integers(1, self._max_noops + 1)):
            obs, _, terminated, truncated, info = self.env.step(self.NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeats each action `skip` frames; the observation is the max of the last two frames.

    The max removes the flicker of sprites that Atari games draw only every other frame.
    """

    def __init__(self, env: gym.Env, skip: int):
        super().__init__(env)
        self._skip = skip

    def step(self, action):
        total_reward = 0.0
        previous_frame = latest_frame = None
        for _ in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total_reward += reward
            previous_frame, latest_frame = latest_frame, obs
            if terminated or truncated:
                break
        obs = latest_frame if previous_frame is None else np.maximum(previous_frame, latest_frame)
        return obs, total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the training episode; reset() then continues the same game.

    Only when the game is really over does reset() start a new game. This helps value
    estimation in games with lives; true_return still counts whole games (GameStatsRecorder).
    """

    NOOP = 0

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            # one no-op step to get an observation in the middle of the running game
            obs, _, terminated, truncated, info = self.env.step(self.NOOP)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        self._game_over = False
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after each reset: games like Breakout wait for it before anything happens."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._fire = env.unwrapped.get_action_meanings().index("FIRE")

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(self._fire)
        if terminated or truncated:
            obs, info = self.env.reset()
        return obs, info


class ResizeFrame(gym.ObservationWrapper):
    """Greyscale (H, W) frame -> (size, size)."""

    def __init__(self, env: gym.Env, size: int):
        super().__init__(env)
        self._size = size
        self.observation_space = spaces.Box(0, 255, (size, size), dtype=np.uint8)

    def observation(self, observation):
        return cv2.resize(observation, (self._size, self._size), interpolation=cv2.INTER_AREA)


class FrameStack(gym.Wrapper):
    """Stacks the last `num_frames` (H, W) frames into one (num_frames, H, W) observation, newest last."""

    def __init__(self, env: gym.Env, num_frames: int):
        super().__init__(env)
        height, width = env.observation_space.shape
        self.observation_space = spaces.Box(0, 255, (num_frames, height, width), dtype=np.uint8)
        self._frames = np.zeros(self.observation_space.shape, dtype=np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._frames[:] = obs  # a new episode starts with the first frame repeated
        return self._frames.copy(), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._frames[:-1] = self._frames[1:]
        self._frames[-1] = obs
        return self._frames.copy(), reward, terminated, truncated, info


# ------------------------------------------------------------------------------------------------
# DeepMind Lab
# ------------------------------------------------------------------------------------------------

DMLAB_WIDTH, DMLAB_HEIGHT = 96, 72
DMLAB30_LEVEL_DIR = "contributed/dmlab30/"

# The IMPALA action set. Each action is DMLab's 7-int action vector:
# (look left/right pixels, look down/up pixels, strafe left/right, move back/forward, fire, jump, crouch)
DMLAB_ACTION_SET = (
    (0, 0, 0, 1, 0, 0, 0),  # forward
    (0, 0, 0, -1, 0, 0, 0),  # backward
    (0, 0, -1, 0, 0, 0, 0),  # strafe left
    (0, 0, 1, 0, 0, 0, 0),  # strafe right
    (-20, 0, 0, 0, 0, 0, 0),  # look left
    (20, 0, 0, 0, 0, 0, 0),  # look right
    (-20, 0, 0, 1, 0, 0, 0),  # look left + forward
    (20, 0, 0, 1, 0, 0, 0),  # look right + forward
    (0, 0, 0, 0, 1, 0, 0),  # fire
)

# DMLab-30 (training level names), with the human and random scores of the IMPALA paper as used by
# DeepMind's scalable_agent. The two rooms_*_train levels are scored against their *_test twins.
DMLAB30_SCORES: dict[str, tuple[float, float]] = {  # level: (human score, random score)
    "rooms_collect_good_objects_train": (10.0, 0.073),
    "rooms_exploit_deferred_effects_train": (85.65, 8.501),
    "rooms_select_nonmatching_object": (65.9, 0.312),
    "rooms_watermaze": (54.0, 4.065),
    "rooms_keys_doors_puzzle": (53.8, 4.135),
    "language_select_described_object": (389.5, -0.07),
    "language_select_located_object": (280.7, 1.929),
    "language_execute_random_task": (254.05, -5.913),
    "language_answer_quantitative_question": (184.5, -0.33),
    "lasertag_one_opponent_small": (12.65, -0.224),
    "lasertag_three_opponents_small": (18.55, -0.214),
    "lasertag_one_opponent_large": (18.6, -0.083),
    "lasertag_three_opponents_large": (31.5, -0.102),
    "natlab_fixed_large_map": (36.9, 2.173),
    "natlab_varying_map_regrowth": (24.45, 2.989),
    "natlab_varying_map_randomized": (42.35, 7.346),
    "skymaze_irreversible_path_hard": (100.0, 0.1),
    "skymaze_irreversible_path_varied": (100.0, 14.4),
    "psychlab_arbitrary_visuomotor_mapping": (58.75, 0.163),
    "psychlab_continuous_recognition": (58.3, 0.224),
    "psychlab_sequential_comparison": (39.5, 0.129),
    "psychlab_visual_search": (78.5, 0.085),
    "explore_object_locations_small": (74.45, 3.575),
    "explore_object_locations_large": (65.65, 4.673),
    "explore_obstructed_goals_small": (206.0, 6.76),
    "explore_obstructed_goals_large": (119.5, 2.61),
    "explore_goal_locations_small": (267.5, 7.66),
    "explore_goal_locations_large": (194.5, 3.14),
    "explore_object_rewards_few": (77.7, 2.073),
    "explore_object_rewards_many": (106.7, 2.438),
}
DMLAB30_LEVELS: list[str] = list(DMLAB30_SCORES)
# held-out twins of two training levels; they exist as levels too (see _dmlab_level_path)
_DMLAB30_TEST_LEVELS = ("rooms_collect_good_objects_test", "rooms_exploit_deferred_effects_test")


def dmlab30_human_normalized_score(level_returns: dict[str, float]) -> float:
    """Mean over the 30 levels of the human-normalised score in percent, each capped at 100.

    `level_returns` maps DMLab-30 training level names (as in info["level_name"]) to mean
    episode returns. Other names are ignored; a missing DMLab-30 level raises ValueError.
    """
    missing = [level for level in DMLAB30_LEVELS if level not in level_returns]
    if missing:
        raise ValueError(f"DMLab-30 score needs returns for all 30 levels; missing: {', '.join(missing)}")
    scores = []
    for level in DMLAB30_LEVELS:
        human, random = DMLAB30_SCORES[level]
        score = 100.0 * (level_returns[level] - random) / (human - random)
        scores.append(min(score, 100.0))
    return float(np.mean(scores))


def _is_dmlab_name(name: str) -> bool:
    return name.startswith("dmlab_") and len(name) > len("dmlab_")


def _dmlab_level_path(level: str) -> str:
    """DMLab-30 names live under contributed/dmlab30/; any other level is passed on as given."""
    if level in DMLAB30_SCORES or level in _DMLAB30_TEST_LEVELS:
        return DMLAB30_LEVEL_DIR + level
    return level


def _dmlab_install_line(env_name: str) -> str:
    return (
        f"--env {env_name} needs deepmind_lab, which has no PyPI wheel: build it from "
        f"https://github.com/google-deepmind/lab with Bazel "
        f"(bazel build -c opt //python/pip_package:build_pip_package && "
        f"./bazel-bin/python/pip_package/build_pip_package /tmp/dmlab_pkg) "
        f"and pip install /tmp/dmlab_pkg/deepmind_lab-*.whl"
    )


def make_dmlab_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    """dmlab_<level>, or dmlab_30: level DMLAB30_LEVELS[env_index % 30], reported as info["level_name"]."""
    if name == "dmlab_30":
        level = DMLAB30_LEVELS[env_index % len(DMLAB30_LEVELS)]
        extra_stats = {"level_name": level}
    else:
        level = name[len("dmlab_"):]
        extra_stats = {}

    frameskip = _frameskip(cfg)
    env = DmLabEnv(
        _dmlab_level_path(level),
        frameskip=frameskip,
        level_cache_dir=getattr(cfg, "dmlab_level_cache_dir", None),
        render_mode=render_mode,
    )
    stats = GameStatsRecorder(env, frames_per_step=frameskip, extra_stats=extra_stats)
    return TrainerInterface(stats, stats, seed=_run_seed(cfg, env_index))


class LevelCache:
    """DMLab level cache over a directory: compiled levels (.pk3) are built once and shared.

    DMLab calls fetch() before compiling a level and write() after; many workers may share the
    directory, so files appear there atomically.
    """

    def __init__(self, cache_dir: str):
        self._cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)

    def fetch(self, key: str, pk3_path: str) -> bool:
        cached = os.path.join(self._cache_dir, key)
        if not os.path.isfile(cached):
            return False
        shutil.copyfile(cached, pk3_path)
        return True

    def write(self, key: str, pk3_path: str) -> None:
        cached = os.path.join(self._cache_dir, key)
        if os.path.isfile(cached):
            return
        fd, partial = tempfile.mkstemp(dir=self._cache_dir, prefix=".partial_")
        os.close(fd)
        shutil.copyfile(pk3_path, partial)
        os.replace(partial, cached)  # readers never see a half-written level


class DmLabEnv(gym.Env):
    """One DeepMind Lab level: 96x72 RGB, the 9 IMPALA actions, each repeated `frameskip` frames."""

    metadata = {"render_modes": ["rgb_array"]}
    num_agents = 1
    OBSERVATION = "RGB_INTERLEAVED"

    def __init__(
        self,
        level: str,
        frameskip: int = DEFAULT_FRAMESKIP,
        level_cache_dir: str | None = None,
        renderer: str = "software",  # headless; "hardware" needs a GPU with EGL
        render_mode: str | None = None,
    ):
        import deepmind_lab

        self.level = level
        self.frameskip = frameskip
        self.render_mode = render_mode
        config = {"width": str(DMLAB_WIDTH), "height": str(DMLAB_HEIGHT)}
        if level.endswith("_test"):
            config["allowHoldOutLevels"] = "true"
        self._lab = deepmind_lab.Lab(
            level,
            [self.OBSERVATION],
            config=config,
            renderer=renderer,
            level_cache=LevelCache(level_cache_dir) if level_cache_dir else None,
        )
        self._actions = np.array(DMLAB_ACTION_SET, dtype=np.intc)  # DMLab wants C ints
        self.action_space = spaces.Discrete(len(DMLAB_ACTION_SET))
        self.observation_space = spaces.Box(0, 255, (3, DMLAB_HEIGHT, DMLAB_WIDTH), dtype=np.uint8)
        self._last_frame = None  # HWC, for render() and for the step that ends the episode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._lab.reset(seed=int(self.np_random.integers(0, 2**31 - 1)))
        return self._observe(), {}

    def step(self, action):
        reward = self._lab.step(self._actions[int(action)], num_steps=self.frameskip)
        finished = not self._lab.is_running()  # no observations once the episode is over
        obs = self._chw(self._last_frame) if finished else self._observe()
        return obs, float(reward), finished, False, {}

    def render(self):
        return self._last_frame if self.render_mode == "rgb_array" else None

    def close(self):
        if self._lab is not None:
            self._lab.close()
            self._lab = None

    def _observe(self) -> np.ndarray:
        self._last_frame = self._lab.observations()[self.OBSERVATION]
        return self._chw(self._last_frame)

    @staticmethod
    def _chw(frame: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(frame.transpose(2, 0, 1))
