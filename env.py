"""Environments for appo.py: VizDoom (doom_*), Atari (atari_<game>), DeepMind Lab (dmlab_*), any
Gymnasium env by id (gym:<id>) and any PettingZoo parallel env by its factory (pz:<module>:<factory>).

    env = create_env("doom_basic", cfg, env_index=3)

Every env returned here speaks the Gymnasium API and follows one contract:
  * observations are uint8 CHW images, float32 vectors, or a Dict of them (Doom: {"obs": image,
    "measurements": vector});
  * actions are Discrete, MultiDiscrete, MultiBinary, a Box of any shape, or a Tuple or Dict of
    them; an observation key "action_mask" (PettingZoo's convention) forbids discrete actions;
  * the reward is the one the learner trains on (Doom: scaled; Atari: clipped to its sign);
  * when a real game ends, the step's info holds "true_return" (raw score of the whole game),
    "true_length" (env frames of the whole game, frameskip included) and "true_objective" (what
    population-based training ranks policies by: the true return, except in self-play Doom matches,
    where it is 1 for a win and 0 otherwise); dmlab_30 adds "level_name";
  * multi-agent envs (doom_duel, doom_deathmatch_full, pz: envs) have num_agents > 1 and take and
    return per-agent lists (an agent out of the game has "agent_left" in its info);
    reward_shaping_weights() and set_reward_shaping() reach the shaped reward of the Doom matches.

The last point is done by two wrappers: GameStatsRecorder sits innermost, below every wrapper
that changes rewards or episode boundaries, and TrainerInterface, the outermost, hands its report
out on the next step() (so a game that ends inside a reset() is still reported).

Each family (Doom scenarios, Doom matches, Atari, DeepMind Lab, gym:) is one Family record in
FAMILIES: how its names look, how one is made, why it cannot be made here, its flag defaults, its
frame rate, its agents per env, and its own flags. Add your own env with register_env(name, factory).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import queue
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

try:
    import cv2  # resizes Doom and Atari frames; DMLab renders at the training size
    # One thread: a frame is small, and the process stepping envs is one of many that keep every core
    # busy; OpenCV's default pool of a thread per core costs more CPU than it saves.
    cv2.setNumThreads(1)
except ImportError:  # env_error() tells the user how to install it
    cv2 = None

# The defaults appo.py takes for every built-in env family (see env_defaults).
DEFAULT_FRAMESKIP = 4
DEFAULT_GAMMA = 0.99


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------

EnvFactory = Callable[[object, int, "str | None"], gym.Env]
Problem = "tuple[type[Exception], str] | None"  # why an env cannot be made here: (exception type, one line)


# Each built-in family's flag_defaults: its frameskip and gamma, then Sample Factory 2.1.1's
# published configuration for the family (the defaults of its sample_factory/cfg/cfg.py, with
# sf_examples/vizdoom/doom/doom_params.py or sf_examples/atari/atari_params.py on top) wherever
# appo.py's own defaults differ. Not tuned to any one env: bench/bench_learning.py measures them
# across the family, and a change needs its table.
@dataclass(frozen=True)
class Family:
    """One env family, everything appo.py asks of an env name answered in one record: how its names
    look, how one is made, why it cannot be made here, the flag defaults it trains with, its game's
    frame rate, its agents per env, and the flags it adds to appo.py with their checks.

    FAMILIES holds the built-in ones (each defined in its section below); register_env puts a
    family of one exact name in front of them."""

    title: str  # its name in messages: "the Doom family"
    matches: Callable[[str], bool]
    make: Callable[[str, object, int, "str | None"], gym.Env]  # (name, cfg, env_index, render_mode)
    known: tuple[str, ...]  # its names, or their pattern, for the unknown-env message
    problem: Callable[[str, object], Problem] = lambda name, cfg: None  # cfg may be None: flags not parsed yet
    # appo.py's flag defaults for it ({}: appo.py's own), or a function of the env name giving them
    flag_defaults: "dict | Callable[[str], dict]" = field(default_factory=dict)
    game_fps: Callable[[str], float] = lambda name: 60.0
    num_agents: Callable[[str], "int | None"] = lambda name: 1  # None: known only once one is made
    add_flags: Callable[[object], None] = lambda group: None  # declares its flags in appo.py's env group
    # (a boolean flag there takes action="switch": --name, --no-name, --name=True/False)
    flag_errors: Callable[[object], list] = lambda cfg: []  # checks them, before anything starts
    # those of its flags that change what the policy sees or does: an evaluation plays with the values
    # the checkpoint was trained with, whatever the command line says
    trained_flags: tuple[str, ...] = ()
    # those that change the model's shape (appo.py's MODEL_FLAGS): a resumed experiment must keep them
    model_flags: tuple[str, ...] = ()
    names_help: str = ""  # its names in appo.py's --env help
    registered: bool = False


FAMILIES: list[Family] = []  # the built-in families, filled in at the end of this file


def register_env(name: str, factory: EnvFactory, *, flag_defaults: dict | None = None,
                 problem: Callable[[object], "str | None"] | None = None, num_agents: int | None = None,
                 game_fps: float = 60.0) -> None:
    """Make `create_env(name, ...)` call `factory(cfg, env_index, render_mode)`.

    Registered names win over the built-in families. `flag_defaults` are appo.py flag defaults for
    this env; without them it gets those of what it observes (one env is made with no flags and
    closed to see): vectors the gym: family's (GYM_VECTOR_DEFAULTS), images, or an env that cannot
    be made without flags, appo.py's own; `problem(cfg)`, asked with the parsed flags, returns
    a one-line reason why the env cannot be made here (naming the fix), or None; `num_agents`, if
    given, lets appo.py check flags against it before making one; `game_fps` sets the speed of
    evaluation videos.
    """
    FAMILIES[:] = [family for family in FAMILIES if family.known != (name,) or not family.registered]
    FAMILIES.insert(0, Family(
        title=f"the registered env {name}",
        matches=lambda env_name: env_name == name,
        make=lambda env_name, cfg, env_index, render_mode: factory(cfg, env_index, render_mode),
        known=(name,),
        problem=lambda env_name, cfg: _registered_problem(problem, cfg),
        flag_defaults=dict(flag_defaults) if flag_defaults is not None else _by_observations(factory),
        game_fps=lambda env_name: game_fps,
        num_agents=lambda env_name: num_agents,
        registered=True,
    ))


def _by_observations(factory: EnvFactory) -> Callable[[str], dict]:
    """A registered env's defaults when it declares none: those of what it observes, found once."""
    @functools.lru_cache(maxsize=None)
    def defaults(env_name: str) -> dict:
        try:
            env = factory(None, 0, None)
        except Exception:  # it needs its flags: appo.py's own defaults
            return {}
        try:
            space = env.observation_space
        finally:
            env.close()
        # a registered env gives appo.py's layout, (C, H, W): any 3-dimensional uint8 Box is an image
        images = _any_subspace(space, lambda box: box.dtype == np.uint8 and len(box.shape) == 3)
        return {} if images else dict(GYM_VECTOR_DEFAULTS)
    return defaults


def _registered_problem(problem: Callable[[object], "str | None"] | None, cfg) -> Problem:
    """A registered env's own check, asked once there are flags to check."""
    line = None if problem is None or cfg is None else problem(cfg)
    return None if line is None else (ValueError, line)


def family_of(name: str) -> Family | None:
    return next((family for family in FAMILIES if family.matches(name)), None)


def create_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    """Build env `name` for the env with global index `env_index` among all envs of the run."""
    problem = _env_problem(name, cfg)
    if problem is not None:
        exception_type, message = problem
        raise exception_type(message)
    return family_of(name).make(name, cfg, env_index, render_mode)


def env_defaults(name: str) -> dict:
    """Per-env defaults for appo.py flags (its family's flag_defaults); {} for unknown names."""
    problem = _env_problem(name)
    if problem is not None and problem[0] is ValueError:  # an unknown name, not a missing package
        return {}
    defaults = family_of(name).flag_defaults
    return dict(defaults(name) if callable(defaults) else defaults)


def env_error(name: str, cfg=None) -> str | None:
    """None if `name` can be created here; otherwise one line naming the problem and the fix.

    Pass the run's flags where an env needs files from them (doom_battle: --doom_scenarios_dir).
    """
    problem = _env_problem(name, cfg)
    return None if problem is None else problem[1]


def num_agents_of(name: str) -> int | None:
    """Learning agents per env of `name`, known without making one; None where only an env knows."""
    family = family_of(name)
    return 1 if family is None else family.num_agents(name)


def game_fps(name: str) -> float:
    """Frames per second of the game itself (videos play at game speed: this / frameskip)."""
    family = family_of(name)
    return 60.0 if family is None else family.game_fps(name)


def trained_flags(name: str) -> tuple[str, ...]:
    """The env flags a checkpoint of `name` must be played with (its family's trained_flags)."""
    family = family_of(name)
    return () if family is None else family.trained_flags


def names_help() -> str:
    """The built-in families' names, for appo.py's --env help."""
    return ", ".join(family.names_help for family in FAMILIES if family.names_help)


def model_flags() -> list[str]:
    """Every family's flags that change the model's shape."""
    return [flag for family in FAMILIES for flag in family.model_flags]


def add_flags(group) -> None:
    """Every family's own flags, declared in appo.py's "env" argument group."""
    for family in FAMILIES:
        family.add_flags(group)


def flag_errors(cfg) -> list[str]:
    """Every family's checks of its own flags (whichever --env runs: a wrong value is wrong anyway)."""
    return [error for family in FAMILIES for error in family.flag_errors(cfg)]


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


def orphaned_shared_memory(older_than_s: float = 5.0) -> list[str]:
    """VizDoom segments in /dev/shm that no running game names on its command line, made more than
    `older_than_s` ago (a game being started has its segments a moment before its process).

    A rollout worker killed inside VizDoom's init, after it made a message queue and before it
    started the game, leaves one that no process tells of (the chaos run once left one): the
    runner sweeps them when it stops, and the rollout workers when the runner was killed."""
    if not os.path.isdir("/dev/shm"):
        return []
    named = {os.path.basename(path) for path in shared_memory_of([int(pid) for pid in os.listdir("/proc")
                                                                   if pid.isdigit()])}
    orphans, now = [], time.time()
    for name in os.listdir("/dev/shm"):
        path = os.path.join("/dev/shm", name)
        if not name.startswith(("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")) or name in named:
            continue
        try:
            info = os.stat(path)
        except OSError:
            continue  # removed meanwhile
        if info.st_uid == os.getuid() and now - info.st_mtime > older_than_s:
            orphans.append(path)  # another user's are theirs to remove
    return orphans


def get_num_agents(env: gym.Env) -> int:
    """Number of agents acting in `env` (1 unless the env says otherwise)."""
    num_agents = getattr(env, "num_agents", None)
    if num_agents is None:
        num_agents = getattr(env.unwrapped, "num_agents", 1)
    return int(num_agents)


def get_agent_spaces(env: gym.Env) -> list[tuple[spaces.Space, spaces.Space]]:
    """Each agent's (observation space, action space), in the order of the env's lists: an env's
    own agent_spaces where its agents differ (a PettingZoo env's), else the env's spaces for all."""
    agent_spaces = getattr(env, "agent_spaces", None) or getattr(env.unwrapped, "agent_spaces", None)
    return list(agent_spaces) if agent_spaces else [(env.observation_space, env.action_space)] * get_num_agents(env)


def space_groups(agent_spaces: list[tuple[spaces.Space, spaces.Space]]) -> tuple[list[tuple], list[int]]:
    """Agents with the same (observation space, action space) form a group, numbered in the order of
    their first agent: (each group's spaces, each agent's group)."""
    groups: list[tuple] = []
    for pair in agent_spaces:
        if pair not in groups:
            groups.append(pair)
    return groups, [groups.index(pair) for pair in agent_spaces]


def get_agent_names(env: gym.Env) -> list[str]:
    """The agents' names in the order of the env's lists: a PettingZoo env's possible_agents, else
    their indices ("0", "1", ...)."""
    names = getattr(env, "agent_names", None) or getattr(env.unwrapped, "agent_names", None)
    return [str(name) for name in names] if names else [str(agent) for agent in range(get_num_agents(env))]


def _env_problem(name: str, cfg=None) -> Problem:
    """(exception type, one-line message) describing why `name` cannot be created, or None."""
    family = family_of(name)
    if family is None:
        return ValueError, _unknown_env_line(name)
    return family.problem(name, cfg)


def _module_available(module_name: str) -> bool:
    # find_spec does not import the (heavy) module; sys.modules covers stand-ins put there by tests
    return module_name in sys.modules or importlib.util.find_spec(module_name) is not None


def _missing_packages(env_name: str, modules_and_packages) -> tuple[type[Exception], str] | None:
    for module_name, pip_name in modules_and_packages:
        if not _module_available(module_name):
            return ImportError, f"--env {env_name} needs {pip_name}: pip install {pip_name}"
    return None


def _unknown_env_line(name: str) -> str:
    known = [known for family in FAMILIES if not family.registered for known in family.known]
    known += sorted(family.known[0] for family in FAMILIES if family.registered)
    return (f"unknown env {name!r} (--env): known envs are {', '.join(known)}; an env added with register_env "
            "exists in the launcher that registers it: run that launcher")


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
                "true_objective": self._game_return,  # only self-play matches rank by anything else
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


def _button_and_value(press) -> tuple[str, float]:
    """A press in an action head is a button name (held down: 1.0) or (button name, value), e.g. the
    degrees per tic of the delta button TURN_LEFT_RIGHT_DELTA."""
    return (press, 1.0) if isinstance(press, str) else (press[0], float(press[1]))


# The paper's full Doom action space. Turning is one delta button with 21 values 1.25 degrees
# apart (negative turns left); bin 10 is 0. VizDoom applies the value on every tic of a step, so a
# step turns value x frameskip degrees.
DOOM_TURN_DEGREES: tuple[float, ...] = tuple(float(d) for d in np.linspace(-12.5, 12.5, 21))
_MOVE = _one_of("MOVE_FORWARD", "MOVE_BACKWARD")
_STRAFE = _one_of("MOVE_RIGHT", "MOVE_LEFT")
_WEAPON = _one_of(*(f"SELECT_WEAPON{slot}" for slot in range(1, 8)))
_TURN = tuple((("TURN_LEFT_RIGHT_DELTA", degrees),) for degrees in DOOM_TURN_DEGREES)
# move 3, strafe 3, attack 2, sprint 2, use 2, weapon 8, turn 21
DOOM_FULL_ACTION_HEADS = (_MOVE, _STRAFE, _one_of("ATTACK"), _one_of("SPEED"), _one_of("USE"), _WEAPON, _TURN)
# the paper's deathmatch agents had no use button: nothing on those maps needs opening
DOOM_FULL_ACTION_HEADS_NO_USE = (_MOVE, _STRAFE, _one_of("ATTACK"), _one_of("SPEED"), _WEAPON, _TURN)

# Ammo of the weapon in each slot that fills a player up without a backpack (a backpack doubles it).
# Slot 1 (fist, chainsaw) needs none; 2 (pistol) and 4 (chaingun) share bullets; 3 shotguns take
# shells, 5 the rocket launcher rockets, 6 (plasma rifle) and 7 (BFG) share cells.
_DOOM_FULL_AMMO = (1.0, 1.0, 200.0, 50.0, 200.0, 50.0, 300.0, 300.0)

# The 23 game variables that duel, deathmatch and battle models see: (variable, scale, low, high);
# the model gets clip(value / scale, low, high). The scales make 1.0 a full or typical amount so
# that no input dwarfs the others in the first layer; the clip bounds the rare extremes: a telefrag
# sets health to -999900, a backpack doubles ammo, a strong agent scores dozens of frags.
DOOM_MEASUREMENTS: tuple[tuple[str, float, float, float], ...] = (
    ("SELECTED_WEAPON", 7.0, 0.0, 1.0),  # weapon slot 0..7
    ("SELECTED_WEAPON_AMMO", 100.0, 0.0, 3.0),  # up to 600 cells with a backpack
    ("HEALTH", 100.0, 0.0, 2.0),  # soul- and megaspheres go up to 200
    ("ARMOR", 100.0, 0.0, 2.0),
    ("FRAGCOUNT", 20.0, -1.0, 5.0),  # suicides count -1
    ("ATTACK_READY", 1.0, 0.0, 1.0),
    ("PLAYER_COUNT", 8.0, 0.0, 2.0),  # players and bots; Doom has room for 16
    *((f"WEAPON{slot}", 1.0, 0.0, 2.0) for slot in range(8)),  # weapons held in the slot (slot 3 can hold 2)
    *((f"AMMO{slot}", _DOOM_FULL_AMMO[slot], 0.0, 2.0) for slot in range(8)),
)
DOOM_MEASUREMENT_NAMES: tuple[str, ...] = tuple(name for name, *_ in DOOM_MEASUREMENTS)
_MEASUREMENT_SCALES = np.array([scale for _, scale, _, _ in DOOM_MEASUREMENTS])
_MEASUREMENT_LOW = np.array([low for _, _, low, _ in DOOM_MEASUREMENTS], dtype=np.float32)
_MEASUREMENT_HIGH = np.array([high for _, _, _, high in DOOM_MEASUREMENTS], dtype=np.float32)


def doom_measurements(values) -> np.ndarray:
    """The model's float32 vector from the game variables in DOOM_MEASUREMENT_NAMES order (a
    sequence), or from a dict holding at least those names."""
    if isinstance(values, dict):
        values = [values[name] for name in DOOM_MEASUREMENT_NAMES]
    scaled = np.asarray(values[: len(DOOM_MEASUREMENTS)], dtype=np.float64) / _MEASUREMENT_SCALES
    return np.clip(scaled, _MEASUREMENT_LOW, _MEASUREMENT_HIGH).astype(np.float32)


def _measurement_space() -> spaces.Box:
    return spaces.Box(_MEASUREMENT_LOW, _MEASUREMENT_HIGH, dtype=np.float32)


@dataclass(frozen=True)
class DoomScenario:
    cfg_file: str
    # One entry per action head; each head lists, per option, the buttons that option presses
    # (see _button_and_value: a name, or a name and the value a delta button takes).
    # A single head gives a Discrete action space, several a Tuple of Discretes.
    action_heads: tuple
    reward_scale: float
    # Game variables given to the model when cfg.doom_game_variables is set.
    game_variables: tuple[str, ...]
    # Always give the model DOOM_MEASUREMENTS (scaled) instead of game_variables / 100.
    full_measurements: bool = False
    # None: the vizdoom package ships the scenario. Otherwise the map that cfg_file names, which
    # has to come from --doom_scenarios_dir with it.
    unpackaged_wad: str | None = None
    # DoomGame settings (set_<name>(value)) that turn the vizdoom package's .cfg into Sample
    # Factory's copy of it, so that doom_<name> is the task behind Sample Factory's results (see
    # _sf_rendering). Applied to the package's files only: --doom_scenarios_dir files stay as written.
    sf_task_settings: tuple[tuple[str, object], ...] = ()
    # Sample Factory's DoomGatheringRewardShaping: +this training reward whenever health goes up (a
    # pickup); the game's own reward, which true_return reports, is left as it is.
    health_pickup_reward: float = 0.0

    @property
    def buttons(self) -> list[str]:
        """Every button the heads use, each once, in order of first use."""
        return _buttons_of(self.action_heads)


def _buttons_of(action_heads) -> list[str]:
    ordered = []
    for head in action_heads:
        for option in head:
            for press in option:
                button, _ = _button_and_value(press)
                if button not in ordered:
                    ordered.append(button)
    return ordered


# Rendering of Sample Factory 2.1.1's own scenario files (sf_examples/vizdoom/doom/scenarios/*.cfg),
# where they differ from the vizdoom package's: the status bar (HUD) shrinks the 3-D view in basic,
# defend_* and deadly_corridor, so every pixel row differs; no decals or particles anywhere; screen
# flashes at the engine default (on). Without these the "same" scenario is a different image task.
def _sf_rendering(hud: bool, weapon: bool = True) -> tuple[tuple[str, object], ...]:
    return (("render_hud", hud), ("render_weapon", weapon), ("render_crosshair", False),
            ("render_decals", False), ("render_particles", False), ("render_screen_flashes", True))


# Sample Factory's health_gathering*.cfg: 0.01 a tic alive and no death penalty (the package's:
# 1 a tic and -100 at death), plus +1 per health pickup from its gathering reward shaping.
_SF_GATHERING = _sf_rendering(hud=False, weapon=False) + (("living_reward", 0.01), ("death_penalty", 0.0))


# Action spaces and reward scales as in Sample Factory's doom_utils.py. The buttons are set here
# rather than taken from the .cfg, so that the action table below is the only truth about them.
DOOM_SCENARIOS: dict[str, DoomScenario] = {
    "doom_basic": DoomScenario(
        "basic.cfg",
        (_one_of("MOVE_LEFT", "MOVE_RIGHT", "ATTACK"),),
        reward_scale=0.01,
        game_variables=("AMMO2",),
        sf_task_settings=_sf_rendering(hud=True),
    ),
    "doom_defend_the_center": DoomScenario(
        "defend_the_center.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("ATTACK")),
        reward_scale=1.0,
        game_variables=("AMMO2", "HEALTH"),
        sf_task_settings=_sf_rendering(hud=True),
    ),
    "doom_defend_the_line": DoomScenario(
        "defend_the_line.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("ATTACK")),
        reward_scale=1.0,
        game_variables=("AMMO2", "HEALTH"),
        sf_task_settings=_sf_rendering(hud=True),
    ),
    "doom_health_gathering": DoomScenario(
        "health_gathering.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
        sf_task_settings=_SF_GATHERING,
        health_pickup_reward=1.0,
    ),
    "doom_health_gathering_supreme": DoomScenario(
        "health_gathering_supreme.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
        # the map (.wad) of Sample Factory's copy differs too: --doom_scenarios_dir with its files for that one
        sf_task_settings=_SF_GATHERING,
        health_pickup_reward=1.0,
    ),
    "doom_my_way_home": DoomScenario(
        "my_way_home.cfg",
        (_one_of("TURN_LEFT", "TURN_RIGHT"), _one_of("MOVE_FORWARD", "MOVE_BACKWARD")),
        reward_scale=1.0,
        # the scenario declares no variables; health keeps the measurement vector non-empty
        game_variables=("HEALTH",),
        sf_task_settings=_sf_rendering(hud=False),
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
        sf_task_settings=_sf_rendering(hud=True),
    ),
    # not in Sample Factory's list (the learning bench adds it there from this same package file):
    # dodge left or right, reward 1 per tic alive
    "doom_take_cover": DoomScenario(
        "take_cover.cfg",
        (_one_of("MOVE_LEFT", "MOVE_RIGHT"),),
        reward_scale=1.0,
        game_variables=("HEALTH",),
    ),
    # The paper's Battle and Battle2 (Sample Factory's maps, not in the vizdoom package): monsters
    # to kill, health and ammo to gather; the map's own reward, the 23 measurements always on.
    "doom_battle": DoomScenario(
        "battle.cfg",
        DOOM_FULL_ACTION_HEADS_NO_USE,
        reward_scale=1.0,
        game_variables=DOOM_MEASUREMENT_NAMES,
        full_measurements=True,
        unpackaged_wad="battle.wad",
    ),
    "doom_battle2": DoomScenario(
        "battle2.cfg",
        DOOM_FULL_ACTION_HEADS_NO_USE,
        reward_scale=1.0,
        game_variables=DOOM_MEASUREMENT_NAMES,
        full_measurements=True,
        unpackaged_wad="battle2.wad",
    ),
}


def make_doom_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    scenario = DOOM_SCENARIOS[name]
    cfg_path = _doom_scenario_file(scenario.cfg_file, getattr(cfg, "doom_scenarios_dir", None))
    env = DoomEnv(
        scenario,
        cfg_path,
        sf_task=getattr(cfg, "doom_scenarios_dir", None) is None,
        frameskip=_frameskip(cfg),
        with_game_variables=scenario.full_measurements or bool(getattr(cfg, "doom_game_variables", False)),
        render_mode=render_mode,
        resize=getattr(cfg, "doom_resize", "area"),
    )
    stats = env = GameStatsRecorder(env, frames_per_step=env.frameskip)
    if scenario.health_pickup_reward:
        env = HealthPickupReward(env, scenario.health_pickup_reward)
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


def _missing_scenario_files(name: str, scenario: DoomScenario, scenarios_dir: str | None):
    """The first scenario file that `name` needs and cannot find, or None. Battle and Battle2 come
    only from --doom_scenarios_dir; the others from there when it is given, else from the package."""
    needed = (scenario.cfg_file,) + ((scenario.unpackaged_wad,) if scenario.unpackaged_wad else ())
    if scenarios_dir is None and scenario.unpackaged_wad is None:
        return None
    for filename in needed:
        if scenarios_dir is None:
            return FileNotFoundError, (
                f"--env {name} needs {filename}, which the vizdoom package does not ship: put "
                f"{' and '.join(needed)} in a folder and pass --doom_scenarios_dir FOLDER"
            )
        if not os.path.isfile(os.path.join(scenarios_dir, filename)):
            return FileNotFoundError, (
                f"--env {name} needs {filename}, not found in --doom_scenarios_dir {scenarios_dir}: "
                f"put {' and '.join(needed)} there"
            )
    return None


def add_doom_flags(group) -> None:
    group.add_argument("--doom_game_variables", action="switch",
                       help="Doom: add the scenario's game variables to the observation")
    group.add_argument("--doom_scenarios_dir", default=None,
                       help="Doom: load scenario .cfg/.wad files from this folder")
    group.add_argument("--doom_resize", choices=sorted(DOOM_RESIZE), default="area",
                       help="Doom (scenarios and matches): how the 160x120 screen shrinks to the model's 128x72: "
                            "area averages the pixels each output pixel covers; nearest takes one of them, as "
                            "Sample Factory does (cheaper, and the same frames as Sample Factory's)")


def doom_flag_errors(cfg) -> list[str]:
    if cfg.doom_scenarios_dir is not None and not os.path.isdir(cfg.doom_scenarios_dir):
        return [f"--doom_scenarios_dir {cfg.doom_scenarios_dir} is not a folder: give the folder that holds "
                "the scenario .cfg and .wad files"]
    return []


def _doom_problem(name: str, cfg=None) -> Problem:
    missing = _missing_packages(name, [("vizdoom", "vizdoom"), ("cv2", "opencv-python-headless")])
    return missing or _missing_scenario_files(name, DOOM_SCENARIOS[name], getattr(cfg, "doom_scenarios_dir", None))


DOOM = Family(  # every single-player scenario (the matches are a family of their own)
    title="the Doom family",
    matches=lambda name: name in DOOM_SCENARIOS,
    make=make_doom_env,
    known=tuple(sorted(DOOM_SCENARIOS)),
    problem=_doom_problem,
    flag_defaults={
        "env_frameskip": DEFAULT_FRAMESKIP, "gamma": DEFAULT_GAMMA,
        # our measurement, not Sample Factory's 1024 (cfg.py): batches of 512, twice the SGD steps per
        # frame (docs/results/ablations.md, "What the Doom family's defaults do")
        "batch_size": 512,
        "with_vtrace": False,  # cfg.py: GAE with lambda 0.95
        # our measurement on doom_basic, whose timeouts are truncations (docs/results/learning.md,
        # "Time limits bootstrapped"); Sample Factory's cfg.py leaves it off
        "value_bootstrap": True,
        "normalize_input": True, "ppo_clip_value": 0.2,  # doom_params.py
        "exploration_loss": "symmetric_kl", "exploration_loss_coeff": 0.001,  # doom_params.py
        # cfg.py, and our measurement: a rollout worker and its game processes on one core spend less
        # CPU a frame at the same FPS (docs/measurements.md); the Atari family's trained slower pinned
        "set_workers_cpu_affinity": True,
    },
    game_fps=lambda name: 35.0,  # Doom's tic rate
    add_flags=add_doom_flags,
    flag_errors=doom_flag_errors,
    trained_flags=("doom_resize",),  # doom_game_variables too, as one of model_flags
    model_flags=("doom_game_variables",),
    names_help="doom_<scenario>",
)


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
        sf_task: bool = True,
        resize: str = "area",
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"Doom envs support render_mode None or 'rgb_array', not {render_mode!r}")
        self.render_mode = render_mode
        self.frameskip = frameskip
        self._resize = resize
        self._with_game_variables = with_game_variables
        self._full_measurements = scenario.full_measurements
        self._button_table = _doom_button_table(scenario.action_heads)
        self.game = _start_doom_game(scenario, cfg_path, scenario.sf_task_settings if sf_task else ())

        self.action_space = _doom_action_space(scenario.action_heads)
        image_space = spaces.Box(0, 255, (3, DOOM_SCREEN_HEIGHT, DOOM_SCREEN_WIDTH), dtype=np.uint8)
        if scenario.full_measurements:
            self.observation_space = spaces.Dict({"obs": image_space, "measurements": _measurement_space()})
        elif with_game_variables:
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
        return _doom_buttons(self._button_table, action)

    def _observe(self):
        state = self.game.get_state()
        self._last_screen = state.screen_buffer
        image = _doom_image(state.screen_buffer, self._resize)
        if self._full_measurements:
            self._last_obs = {"obs": image, "measurements": doom_measurements(state.game_variables)}
        elif self._with_game_variables:
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


# How --doom_resize shrinks the screen (OpenCV's interpolations): "area" averages the pixels each
# output pixel covers; "nearest" takes one of them, as Sample Factory 2.1.1 does for Doom (the
# ResizeWrapper its doom_utils.py applies), for far less CPU a frame (docs/results/throughput.md).
DOOM_RESIZE = {"area": "INTER_AREA", "nearest": "INTER_NEAREST"}


def _doom_image(screen: np.ndarray, resize: str = "area") -> np.ndarray:
    """160x120 HWC screen -> the model's 128x72 CHW frame."""
    interpolation = getattr(cv2, DOOM_RESIZE[resize])
    resized = cv2.resize(screen, (DOOM_SCREEN_WIDTH, DOOM_SCREEN_HEIGHT), interpolation=interpolation)
    return np.ascontiguousarray(resized.transpose(2, 0, 1))


def _doom_action_space(action_heads) -> spaces.Space:
    heads = [spaces.Discrete(len(head)) for head in action_heads]
    return heads[0] if len(heads) == 1 else spaces.Tuple(heads)


def _doom_button_table(action_heads) -> list[np.ndarray]:
    """Per head, a (num_options, num_buttons) array of button values; summing the chosen rows over
    the heads gives the buttons to send (no two heads share a button)."""
    buttons = _buttons_of(action_heads)
    tables = []
    for head in action_heads:
        table = np.zeros((len(head), len(buttons)), dtype=np.float64)
        for option, presses in enumerate(head):
            for press in presses:
                button, value = _button_and_value(press)
                table[option, buttons.index(button)] = value
        tables.append(table)
    return tables


def _doom_buttons(button_table: list[np.ndarray], action) -> list:
    heads = (action,) if len(button_table) == 1 else action
    pressed = sum(table[int(option)] for table, option in zip(button_table, heads))
    return pressed.tolist()


def _configure_doom_game(game, buttons: list[str], game_variables) -> None:
    """What every Doom env shares: 160x120 RGB off screen, synchronous, these buttons and variables."""
    import vizdoom as vzd

    game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    game.set_screen_format(vzd.ScreenFormat.RGB24)
    game.set_window_visible(False)
    game.set_mode(vzd.Mode.PLAYER)  # synchronous: the game waits for our actions
    game.set_available_buttons([getattr(vzd.Button, button) for button in buttons])
    game.set_available_game_variables([getattr(vzd.GameVariable, var) for var in game_variables])
    # VizDoom writes its settings file into the working directory unless told otherwise
    game.set_doom_config_path(os.path.join(tempfile.gettempdir(), "appo_vizdoom.ini"))


def _start_doom_game(scenario: DoomScenario, cfg_path: str, settings: tuple[tuple[str, object], ...] = ()):
    import vizdoom as vzd

    game = vzd.DoomGame()
    game.load_config(cfg_path)
    wad_path = game.get_doom_scenario_path()  # resolved relative to the .cfg
    if wad_path and not os.path.isfile(wad_path):
        raise FileNotFoundError(f"Doom scenario file {wad_path} (named in {cfg_path}) not found; check --doom_scenarios_dir")
    for name, value in settings:
        getattr(game, f"set_{name}")(value)
    _configure_doom_game(game, scenario.buttons, scenario.game_variables)
    game.init()
    return game


class HealthPickupReward(gym.Wrapper):
    """Sample Factory's gathering shaping: +`bonus` on every step (but an episode's last) after which
    the player's health is higher than after the step before. It sits above GameStatsRecorder, so
    true_return stays the game's own reward."""

    def __init__(self, env: gym.Env, bonus: float):
        super().__init__(env)
        self._bonus = bonus
        self._last_health: float | None = None

    def reset(self, **kwargs):
        self._last_health = None
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            return obs, reward, terminated, truncated, info
        import vizdoom as vzd

        health = self.env.unwrapped.game.get_game_variable(vzd.GameVariable.HEALTH)
        if self._last_health is not None and health > self._last_health:
            reward += self._bonus
        self._last_health = health
        return obs, reward, terminated, truncated, info


# ------------------------------------------------------------------------------------------------
# VizDoom matches: duel and deathmatch against bots and in self-play, with reward shaping
# ------------------------------------------------------------------------------------------------

# The paper's settings for duel and deathmatch: a finer action repeat and a longer horizon.
DOOM_MATCH_DEFAULTS = {"env_frameskip": 2, "gamma": 0.995}

# The training reward of the matches: weight x the per-step change of a game quantity (see
# doom_reward_events). One table, so that population-based training can mutate every weight
# (appo.py's reward/<name> hyperparameters); set_reward_shaping() gives an agent other weights.
DOOM_REWARD_SHAPING: dict[str, float] = {
    "frag": 1.0,  # the game's own score (a suicide counts -1)
    "death": -0.5,  # dying also loses the weapons and ammo gathered
    "hit": 0.01,  # per shot that hits another player
    "damage": 0.002,  # per hit point dealt: taking a full-health player down adds 0.2
    "hit_taken": -0.005,
    "damage_taken": -0.001,  # per hit point lost
    "health": 0.002,  # per hit point picked up: a medikit adds 0.05
    "armor": 0.002,  # per armour point picked up: green armour adds 0.2
    "weapon": 0.2,  # x DOOM_WEAPON_PREFERENCE of each weapon picked up
    "ammo": 0.2,  # x preference, per full load (_DOOM_FULL_AMMO) of ammo picked up
}

# What a weapon slot is worth when picked up: the stronger the weapon, the more. Slot 1 fist and
# chainsaw, 2 pistol, 3 shotguns, 4 chaingun, 5 rocket launcher, 6 plasma rifle, 7 BFG.
DOOM_WEAPON_PREFERENCE: tuple[float, ...] = (0.0, 0.1, 0.1, 0.5, 0.5, 1.0, 0.8, 0.8)
# Each ammo type once (slots 4 and 7 share the ammo of 2 and 6), worth its best weapon.
_DOOM_AMMO_PREFERENCE = {"AMMO2": 0.5, "AMMO3": 0.5, "AMMO5": 1.0, "AMMO6": 0.8}
# Damage counters jump by 1,000,000 on a telefrag; no fight deals more than this in one step.
_DOOM_MAX_DAMAGE_PER_STEP = 200.0

# What the shaping and the game statistics read, besides the measurements.
_DOOM_EVENT_VARIABLES = ("DEATHCOUNT", "HITCOUNT", "HITS_TAKEN", "DAMAGECOUNT", "DAMAGE_TAKEN")
DOOM_MATCH_VARIABLES: tuple[str, ...] = DOOM_MEASUREMENT_NAMES + _DOOM_EVENT_VARIABLES


def doom_reward_events(previous: dict[str, float], current: dict[str, float]) -> dict[str, float]:
    """How much of each DOOM_REWARD_SHAPING quantity happened between two readings of one player's
    game variables (dicts holding DOOM_MATCH_VARIABLES)."""

    def gain(name: str) -> float:
        return current[name] - previous[name]

    died = gain("DEATHCOUNT") > 0
    # pickups count only while alive before and after: a respawn refills health and resets the
    # weapons without any pickup
    alive = not died and previous["HEALTH"] > 0 and current["HEALTH"] > 0

    def picked_up(name: str) -> float:
        return max(gain(name), 0.0) if alive else 0.0

    return {
        "frag": gain("FRAGCOUNT"),
        "death": gain("DEATHCOUNT"),
        "hit": gain("HITCOUNT"),
        "damage": min(gain("DAMAGECOUNT"), _DOOM_MAX_DAMAGE_PER_STEP),
        "hit_taken": gain("HITS_TAKEN"),
        "damage_taken": min(gain("DAMAGE_TAKEN"), _DOOM_MAX_DAMAGE_PER_STEP),
        "health": picked_up("HEALTH"),
        "armor": picked_up("ARMOR"),
        "weapon": sum(DOOM_WEAPON_PREFERENCE[slot] * picked_up(f"WEAPON{slot}") for slot in range(8)),
        "ammo": sum(
            preference * picked_up(name) / _DOOM_FULL_AMMO[int(name[-1])]
            for name, preference in _DOOM_AMMO_PREFERENCE.items()
        ),
    }


class DoomRewardShaping:
    """One agent's shaped reward: sum of weight x doom_reward_events between consecutive readings.

    start() takes the game variables at the start of a game, reward() those after each step.
    """

    def __init__(self, weights: dict[str, float] | None = None):
        self.weights = dict(DOOM_REWARD_SHAPING)
        self._previous: dict[str, float] | None = None
        if weights:
            self.set_weights(weights)

    def set_weights(self, weights: dict[str, float]) -> None:
        """New values for some or all weights; other names are an error."""
        unknown = sorted(set(weights) - set(DOOM_REWARD_SHAPING))
        if unknown:
            raise ValueError(
                f"unknown Doom reward-shaping weights {', '.join(unknown)}; known are {', '.join(DOOM_REWARD_SHAPING)}"
            )
        self.weights.update({name: float(value) for name, value in weights.items()})

    def start(self, variables: dict[str, float]) -> None:
        self._previous = dict(variables)

    def reward(self, variables: dict[str, float]) -> float:
        events = doom_reward_events(self._previous, variables)
        self._previous = dict(variables)
        return float(sum(self.weights[name] * amount for name, amount in events.items()))


def reward_shaping_weights(env: gym.Env) -> dict[str, float] | None:
    """The reward-shaping weights of agent 0 of `env` (as created: the defaults), or None if the env
    has no shaped reward."""
    match = _find_doom_match(env)
    return None if match is None else match.reward_shaping_weights(0)


def set_reward_shaping(env: gym.Env, agent: int, weights: dict[str, float]) -> None:
    """Gives agent `agent` of `env` these reward-shaping weights from its next step on."""
    match = _find_doom_match(env)
    if match is None:
        raise ValueError(f"{env} has no reward shaping (only the doom_*duel*/doom_*deathmatch* envs do)")
    match.set_reward_shaping(agent, weights)


def _find_doom_match(env) -> "DoomMatchEnv | None":
    # gymnasium wrappers do not forward attributes: walk down the chain
    while env is not None:
        if isinstance(env, DoomMatchEnv):
            return env
        env = getattr(env, "env", None)
    return None


@dataclass(frozen=True)
class DoomMatch:
    """A deathmatch on a map of the vizdoom package: `num_agents` learning players (agent 0 hosts
    the network game, the others join it) and `num_bots` of ZDoom's built-in bots."""

    wad_file: str
    map_name: str
    num_agents: int
    num_bots: int
    minutes: float  # match length, unless cfg.doom_match_minutes says otherwise
    action_heads: tuple

    @property
    def self_play(self) -> bool:
        """Agents play each other: the objective is winning, not the number of frags."""
        return self.num_agents > 1


# Maps of the vizdoom package. multi_duel.wad: a small arena with 2 deathmatch starts, where
# everyone (re)spawns with a rocket launcher; mind the pit. cig.wad MAP02 (the CIG 2016 full
# deathmatch map): 11 deathmatch starts, a pistol to start with and the whole arsenal, ammo, health
# and armour to pick up. Not multi_deathmatch.wad: a two-player game that ends at the first kill,
# with 2 starts (8 players kept telefragging each other there); not cig.wad MAP01: rockets only.
DOOM_MATCHES: dict[str, DoomMatch] = {
    "doom_duel_bots": DoomMatch("multi_duel.wad", "map01", num_agents=1, num_bots=1, minutes=3.0,
                                action_heads=DOOM_FULL_ACTION_HEADS),
    "doom_duel": DoomMatch("multi_duel.wad", "map01", num_agents=2, num_bots=0, minutes=3.0,
                           action_heads=DOOM_FULL_ACTION_HEADS),
    "doom_deathmatch_bots": DoomMatch("cig.wad", "map02", num_agents=1, num_bots=7, minutes=4.0,
                                      action_heads=DOOM_FULL_ACTION_HEADS_NO_USE),
    "doom_deathmatch_full": DoomMatch("cig.wad", "map02", num_agents=4, num_bots=4, minutes=4.0,
                                      action_heads=DOOM_FULL_ACTION_HEADS_NO_USE),
}

# A VizDoom call of a healthy match returns within milliseconds; a player whose peer died waits
# for it forever, so after this long the match counts as failed (and its processes are killed).
# Well under appo.py's --env_step_timeout (60 s): the env fails and is made again before the
# trainer gives up on the whole rollout worker.
DOOM_MATCH_TIMEOUT_S = 30.0
# A player that runs more than 2 tics in one VizDoom call can leave a peer waiting for it forever
# (in vizdoom 1.3.2 a frameskip of 3 stalled a duel now and then, 4 nearly always; 1 and 2 never did
# in thousands of steps), so network players run longer frameskips in rounds of at most this many
# tics, all players together.
DOOM_NET_TICS_PER_CALL = 2
# How long the host waits for the others to join before VizDoom gives up (which, in vizdoom 1.3.2,
# crashes the Python process: see _reserve_match_port). Generous: envs start slowly on a busy machine.
DOOM_CONNECT_TIMEOUT_S = 60


def make_doom_match_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> "DoomMatchEnv":
    minutes = getattr(cfg, "doom_match_minutes", None)
    return DoomMatchEnv(
        DOOM_MATCHES[name],
        frameskip=_frameskip(cfg),
        minutes=None if minutes is None else float(minutes),
        seed=_run_seed(cfg, env_index),
        render_mode=render_mode,
        resize=getattr(cfg, "doom_resize", "area"),
    )


def add_doom_match_flags(group) -> None:
    group.add_argument("--doom_match_minutes", type=float, default=None,
                       help="Doom duel and deathmatch envs: minutes of game time per match "
                            "(default: the env's, 3 for duels and 4 for deathmatches)")


def doom_match_flag_errors(cfg) -> list[str]:
    if cfg.doom_match_minutes is not None and not cfg.doom_match_minutes > 0:
        return [f"--doom_match_minutes must be positive, got {cfg.doom_match_minutes}"]
    return []


DOOM_MATCH = Family(
    title="the Doom matches",
    matches=lambda name: name in DOOM_MATCHES,
    make=make_doom_match_env,
    known=tuple(sorted(DOOM_MATCHES)),
    problem=lambda name, cfg=None: _missing_packages(name, [("vizdoom", "vizdoom"), ("cv2", "opencv-python-headless")]),
    flag_defaults=dict(DOOM_MATCH_DEFAULTS),  # no single-player family's defaults: the paper's match settings
    game_fps=lambda name: 35.0,
    num_agents=lambda name: DOOM_MATCHES[name].num_agents,
    add_flags=add_doom_match_flags,
    flag_errors=doom_match_flag_errors,
    trained_flags=("doom_resize",),
)


class _PlayerThread:
    """Runs one player's VizDoom calls on a thread of its own, one task at a time; each result
    (tag, error or None, value) goes to the shared `results` queue."""

    def __init__(self, name: str, results: queue.SimpleQueue):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._results = results
        # daemon: a player stuck inside VizDoom must not keep the interpreter from exiting
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, tag, function, *args) -> None:
        self._tasks.put((tag, function, args))

    def stop(self) -> None:
        self._tasks.put(None)

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            tag, function, args = task
            try:
                self._results.put((tag, None, function(*args)))
            except BaseException as error:  # the caller raises it
                self._results.put((tag, error, None))


class _DoomNetGame:
    """The players of one Doom match: one vizdoom process each, and with several a network game
    over UDP on this machine (port reserved by _reserve_match_port). A network game runs a tic only
    once every player sent its input for it, so each VizDoom call that runs tics (init,
    new_episode, advance_action) blocks until the other players make theirs: every player's calls
    run on a thread of its own (VizDoom releases the GIL while it runs or waits) and
    on_every_player returns when all have answered. A player that fails or hangs
    (DOOM_MATCH_TIMEOUT_S) fails the whole game: its processes are killed and the call raises."""

    def __init__(self, num_players: int, make_game: Callable[[int, "int | None"], object], name: str):
        self.name = name  # for messages: the map
        self.port, self._port_token = _reserve_match_port() if num_players > 1 else (None, None)
        self.games = []
        self._threads: list[_PlayerThread] = []
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._calls = 0  # tags results, so that an answer to an abandoned call is never taken for a newer one
        self._failure: BaseException | None = None
        self._closed = False
        self._shared_memory: list[str] = []
        try:
            self.games = [make_game(player, self.port) for player in range(num_players)]
            if num_players > 1:
                self._threads = [_PlayerThread(f"doom-player-{player}", self._results) for player in range(num_players)]
            self.on_every_player(lambda player, _: self.games[player].init(), [None] * num_players,
                                 timeout_s=DOOM_CONNECT_TIMEOUT_S + DOOM_MATCH_TIMEOUT_S)
            if num_players > 1:
                self._shared_memory = shared_memory_of(self._player_processes())
        except BaseException:
            self.close()
            raise

    def on_every_player(self, function, per_player_args: list, timeout_s: float | None = None) -> list:
        """[function(player, arg) for each player], all players at once; raises if any fails or hangs.

        A failed match stays failed: appo.py closes it and makes a new one.
        """
        if self._failure is not None:
            raise RuntimeError(f"this Doom match failed earlier ({self._failure!r}); close it and create a new env")
        if self._closed:
            raise RuntimeError("this Doom match is closed")
        if not self._threads:  # a single player blocks on nobody
            return [function(0, per_player_args[0])]
        if timeout_s is None:
            timeout_s = DOOM_MATCH_TIMEOUT_S
        self._calls += 1
        for player, thread in enumerate(self._threads):
            thread.submit((self._calls, player), function, player, per_player_args[player])
        results, answered = [None] * len(self.games), [False] * len(self.games)
        deadline = time.monotonic() + timeout_s
        while not all(answered):
            try:
                tag, error, value = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                late = [player for player, done in enumerate(answered) if not done]
                tag, value = (self._calls, late[0]), None
                error = TimeoutError(f"Doom players {late} did not answer within {timeout_s:g} s")
            if tag is None or tag[0] != self._calls:
                continue  # the end of close(), or the late answer of a call abandoned earlier
            if error is not None:
                self._fail(error, player=tag[1])
            results[tag[1]] = value
            answered[tag[1]] = True
        return results

    def close(self):
        if self._closed:
            return
        self._closed = True
        if self._threads:
            for thread, game in zip(self._threads, self.games):
                thread.submit(None, game.close)
                thread.stop()
            if not self._threads_finished(within_s=10.0):
                self._kill_players()  # a player stuck in VizDoom returns once its process is gone
                self._threads_finished(within_s=10.0)
        else:
            for game in self.games:
                game.close()
        self.games, self._threads = [], []
        for path in self._shared_memory:  # VizDoom's own close removes these unless a process died badly
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if self._port_token is not None:
            self._port_token.close()
            self._port_token = None

    def _fail(self, error: BaseException, player: int | None = None):
        """Marks the game failed, ends its processes (the other players would wait for the failed
        one forever) and raises."""
        self._failure = error
        self._kill_players()
        who = "" if player is None else f"agent {player} of "
        raise RuntimeError(f"{who}a Doom match on {self.name} failed: {error!r}") from error

    def _player_processes(self) -> list[int]:
        """The vizdoom processes of this game: children of this process hosting or joining its port."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().decode(errors="replace").split("\0")
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
            if parent == os.getpid() and "+viz_instance_id" in args and "-port" in args[:-1]:
                if args[args.index("-port") + 1] == str(self.port):
                    found.append(int(entry))
        return found

    def _kill_players(self) -> None:
        if self.port is None:
            return
        for pid in self._player_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _threads_finished(self, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        for thread in self._threads:
            thread.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.thread.is_alive() for thread in self._threads)


class DoomMatchEnv(gym.Env):
    """One Doom deathmatch (DoomMatch): its agents, its bots, and the shaped reward of each agent.

    One agent: the usual single-agent API. Several: one env for all of them, as appo.py expects:
    reset() -> (list of obs, list of infos); step(list of actions) -> (list of obs, list of rewards,
    list of terminated, list of truncated, list of infos). Observations are {"obs": 3x72x128 uint8,
    "measurements": the 23 DOOM_MEASUREMENTS}; the reward is DoomRewardShaping's. When the match
    ends (its time limit; for all agents at the same tic), each info holds true_return (the agent's
    frags), true_length (frames) and true_objective (frags against bots; in self-play 1.0 for more
    frags than every other agent, else 0.0).

    Each agent plays its own vizdoom process, all of them one network game (_DoomNetGame runs the
    processes). All players run the step's `frameskip` tics together (in rounds of at most
    DOOM_NET_TICS_PER_CALL), and a step returns when all have. Dead agents come back by the
    server's forced respawn; respawn_player() would run tics for one player alone and wait forever
    for the others. A player that fails or hangs fails the whole match: the call raises RuntimeError.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        match: DoomMatch,
        frameskip: int = 2,
        minutes: float | None = None,
        seed: int | None = None,
        render_mode: str | None = None,
        resize: str = "area",
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"Doom envs support render_mode None or 'rgb_array', not {render_mode!r}")
        self.match = match
        self._resize = resize
        self.num_agents = match.num_agents
        self.frameskip = frameskip
        self.minutes = match.minutes if minutes is None else minutes
        self.render_mode = render_mode
        self.action_space = _doom_action_space(match.action_heads)
        self.observation_space = spaces.Dict({
            "obs": spaces.Box(0, 255, (3, DOOM_SCREEN_HEIGHT, DOOM_SCREEN_WIDTH), dtype=np.uint8),
            "measurements": _measurement_space(),
        })
        self._button_table = _doom_button_table(match.action_heads)
        self._shaping = [DoomRewardShaping() for _ in range(self.num_agents)]
        self._first_seed = seed
        self._last_obs: list = [None] * self.num_agents
        self._last_screen = None
        self._frags_at_start = [0.0] * self.num_agents
        self._frags = [0.0] * self.num_agents
        self._game_length = 0
        self._net = _DoomNetGame(self.num_agents, self._new_game, match.wad_file)

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self._first_seed
        self._first_seed = None
        super().reset(seed=seed)
        doom_seed = None if seed is None else seed % 2**32  # Doom seeds are 32-bit
        looks = self._net.on_every_player(self._new_episode, [doom_seed] * self.num_agents)
        if self.match.num_bots:
            host = self._net.games[0]
            host.send_game_command("removebots")  # bots outlive a restart of the map
            for _ in range(self.match.num_bots):
                host.send_game_command("addbot")
        for agent, (_, variables, _) in enumerate(looks):
            self._shaping[agent].start(variables)
            # Doom zeroes the frag count of a new match but keeps other counters: count from here
            self._frags_at_start[agent] = variables["FRAGCOUNT"]
        self._frags = [0.0] * self.num_agents
        self._game_length = 0
        obs = [look[0] for look in looks]
        infos = [{} for _ in looks]
        return (obs[0], infos[0]) if self.num_agents == 1 else (obs, infos)

    def step(self, actions):
        per_agent = [actions] if self.num_agents == 1 else list(actions)
        if len(per_agent) != self.num_agents:
            raise ValueError(f"{self.num_agents} agents need {self.num_agents} actions, got {len(per_agent)}")
        if self.num_agents == 1:
            rounds = [self.frameskip]
        else:
            rounds = [DOOM_NET_TICS_PER_CALL] * (self.frameskip // DOOM_NET_TICS_PER_CALL)
            rounds += [self.frameskip % DOOM_NET_TICS_PER_CALL] if self.frameskip % DOOM_NET_TICS_PER_CALL else []
        for round_index, tics in enumerate(rounds):
            last_round = round_index == len(rounds) - 1
            looks = self._net.on_every_player(functools.partial(self._step_player, tics=tics, last_round=last_round),
                                              per_agent)
        self._game_length += self.frameskip
        match_over = any(over for _, _, over in looks)
        rewards, infos = [], []
        for agent, (_, variables, _) in enumerate(looks):
            rewards.append(self._shaping[agent].reward(variables))
            self._frags[agent] = variables["FRAGCOUNT"] - self._frags_at_start[agent]
            infos.append({})
        if match_over:
            for agent, info in enumerate(infos):
                info["true_return"] = self._frags[agent]
                info["true_length"] = self._game_length
                info["true_objective"] = self._objective(agent)
        obs = [look[0] for look in looks]
        if self.num_agents == 1:
            return obs[0], rewards[0], match_over, False, infos[0]
        return obs, rewards, [match_over] * self.num_agents, [False] * self.num_agents, infos

    def render(self):
        """Agent 0's view at full resolution (HWC RGB)."""
        return self._last_screen if self.render_mode == "rgb_array" else None

    def close(self):
        if getattr(self, "_net", None) is not None:
            self._net.close()

    # -- for appo.py (population-based training) and evaluation ---------------------------------

    def reward_shaping_weights(self, agent: int) -> dict[str, float]:
        return dict(self._shaping[agent].weights)

    def set_reward_shaping(self, agent: int, weights: dict[str, float]) -> None:
        if not 0 <= agent < self.num_agents:
            raise ValueError(f"agent {agent} does not exist: this env has {self.num_agents} agent(s)")
        self._shaping[agent].set_weights(weights)

    def buttons_for(self, action) -> list[float]:
        """The value of each button (in the order of the game's available buttons) for an action."""
        return _doom_buttons(self._button_table, action)

    @property
    def game_return(self) -> float:
        """Agent 0's frags in the match so far (evaluation shows them on its video)."""
        return self._frags[0]

    @property
    def port(self) -> int | None:
        """The UDP port the host listens on (None with a single agent: no network game)."""
        return self._net.port

    @property
    def games(self) -> list:
        """Each agent's vizdoom.DoomGame (to inspect it; calling one that runs tics would hang)."""
        return list(self._net.games)

    # -- the players ----------------------------------------------------------------------------

    def _new_game(self, agent: int, port: int | None):
        import vizdoom as vzd

        game = vzd.DoomGame()
        game.set_doom_scenario_path(os.path.join(vzd.scenarios_path, self.match.wad_file))
        game.set_doom_map(self.match.map_name)
        _configure_doom_game(game, _buttons_of(self.match.action_heads), DOOM_MATCH_VARIABLES)
        game.set_render_hud(False)  # the measurements carry what the HUD shows
        game.set_render_crosshair(True)
        if self._first_seed is not None:
            # where players spawn follows the seed the game starts with, not one set before a new match
            game.set_seed(self._first_seed % 2**32)
        if agent == 0:
            args = [
                f"-host {self.num_agents}",  # network players; the bots come on top
                "-deathmatch",
                f"+timelimit {self.minutes}",  # minutes of game time; then the match is over for all
                "+sv_forcerespawn 1",  # the dead come back by themselves (see the class docstring)
                "+viz_respawn_delay 0",
                "+sv_respawnprotect 1",  # a moment of invulnerability after spawning
                "+sv_spawnfarthest 1",
                "+sv_noautoaim 1",
                "+sv_nocrouch 1",
                "+sv_nojump 1",
                "+sv_nofreelook 1",  # the action space has no looking up or down
                "+sv_noexit 1",  # the match ends by its time limit, not at an exit switch
            ]
            if self.num_agents > 1:
                args.append(f"-port {port}")
        else:
            args = [f"-join 127.0.0.1 -port {port}"]
        if self.num_agents > 1:
            args.append(f"+viz_connect_timeout {DOOM_CONNECT_TIMEOUT_S}")
        args.append(f"+name agent{agent} +colorset {agent % 8}")
        game.add_game_args(" ".join(args))
        return game

    def _new_episode(self, agent: int, doom_seed: int | None):
        game = self._net.games[agent]
        if doom_seed is not None:
            game.set_seed(doom_seed)  # every player the same: the network game is one simulation
        game.new_episode()
        return self._look(agent)

    def _step_player(self, agent: int, action, tics: int, last_round: bool):
        """Runs `tics` tics of one player; only the last round of a step renders and looks."""
        game = self._net.games[agent]
        if game.is_episode_finished():  # the match ended in an earlier round of this step
            return self._look(agent) if last_round else None
        game.set_action(self.buttons_for(action))
        game.advance_action(tics, last_round)
        if self.num_agents == 1 and game.is_player_dead() and not game.is_episode_finished():
            game.respawn_player()  # alone on the network, respawning waits for nobody
        return self._look(agent) if last_round else None

    def _look(self, agent: int):
        """(observation, game variables as a dict, whether the match is over) of one player."""
        game = self._net.games[agent]
        if game.is_episode_finished():  # no state any more; the variables can still be read
            values = [game.get_game_variable(variable) for variable in game.get_available_game_variables()]
            return self._last_obs[agent], dict(zip(DOOM_MATCH_VARIABLES, values)), True
        state = game.get_state()
        values = state.game_variables
        obs = {"obs": _doom_image(state.screen_buffer, self._resize), "measurements": doom_measurements(values)}
        self._last_obs[agent] = obs
        if agent == 0:
            self._last_screen = state.screen_buffer
        return obs, dict(zip(DOOM_MATCH_VARIABLES, values.tolist())), False

    def _objective(self, agent: int) -> float:
        if not self.match.self_play:
            return self._frags[agent]
        others = [frags for other, frags in enumerate(self._frags) if other != agent]
        return 1.0 if self._frags[agent] > max(others) else 0.0


_MATCH_PORT_TOKEN_PREFIX = "\0appo-vizdoom-udp-port-"  # abstract Unix socket names (Linux)


def _reserve_match_port(attempts: int = 1000) -> tuple[int, socket.socket | None]:
    """A UDP port for a match's host, and the token that keeps every other match off it until closed.

    Why not simply bind port 0 and hand the port the OS picked to the host: vizdoom 1.3.2 crashes
    the whole Python process (segfault) when a network game fails to start, e.g. when the host
    cannot bind its port, so there is no retrying after a collision; and a port from bind(0) is
    free again between the probe and the host's bind, in the very range (the OS's ephemeral ports)
    from which the joining players bind theirs. So: a random port outside the ephemeral range,
    drawn from the OS's entropy (envs seeded alike must not draw alike), reserved by binding an
    abstract Unix socket named after it (the kernel refuses a second bind of a name, machine-wide,
    and frees it when the token is closed or its process dies: no files to clean up), then probed
    with a UDP bind in case a program outside appo holds it.
    """
    lowest_ephemeral, highest_ephemeral = _ephemeral_port_range()
    draw = random.SystemRandom()
    for _ in range(attempts):
        port = draw.randrange(1024, 65536)
        if lowest_ephemeral <= port <= highest_ephemeral:
            continue
        token = None
        if sys.platform.startswith("linux"):
            token = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                token.bind(f"{_MATCH_PORT_TOKEN_PREFIX}{port}")
            except OSError:  # another match has it
                token.close()
                continue
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind(("", port))  # all interfaces, as the host will
        except OSError:
            if token is not None:
                token.close()
            continue
        finally:
            probe.close()
        return port, token
    raise RuntimeError(f"no free UDP port for a Doom match after {attempts} tries")


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(value) for value in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


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


ATARI = Family(
    title="the Atari family",
    matches=_is_atari_name,
    make=make_atari_env,
    known=("atari_<game> (any ALE game)",),
    names_help="atari_<game>",
    problem=lambda name, cfg=None: (_missing_packages(name, [("ale_py", "ale-py"), ("cv2", "opencv-python-headless")])
                                    or _unknown_atari_game(name)),
    flag_defaults={  # atari_params.py, chosen there to match CleanRL's and Stable-Baselines3's PPO
        "env_frameskip": DEFAULT_FRAMESKIP, "gamma": DEFAULT_GAMMA,
        "rnn_type": "none", "encoder": "convnet_atari",  # the frame stack is the memory
        "rollout": 128, "batch_size": 256, "num_batches_per_epoch": 4, "num_epochs": 4,  # 16 steps of 256
        # linear_decay to 0 at the budget: CleanRL's ppo_atari.py (anneal_lr) and Stable-Baselines3's
        # zoo (lin_2.5e-4), the schedule atari_params.py means to match. Sample Factory's own reaches 0
        # at 4x the budget (it counts samples, not frames; see --lr_decay_frames). docs/results/ablations.md,
        # "The Atari learning-rate horizon", compares the two
        "with_vtrace": False, "learning_rate": 2.5e-4, "lr_schedule": "linear_decay",
        # the budget, and so the schedule's horizon, of CleanRL's ppo_atari.py (10M steps) and of
        # atari_params.py (10M samples): 40M frames at frameskip 4; a budget of your own replaces it
        "train_for_env_steps": 40_000_000,
        "max_grad_norm": 0.5, "adam_eps": 1e-5, "normalize_input": True, "exploration_loss_coeff": 0.01,
        # our measurement on atari_pong, whose 108,000-frame limit is a truncation (docs/results/learning.md,
        # "Time limits bootstrapped"); atari_params.py leaves it off
        "value_bootstrap": True,
        # collect a batch, then train on it, as atari_params.py does (the batch is whole rollouts of
        # every env: appo.fit_synchronous_batches); docs/results/learning.md compares it with asynchronous
        "async_rl": False,
    },
)


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


def add_dmlab_flags(group) -> None:
    group.add_argument("--dmlab_level_cache_dir", default=None, help="DMLab: folder for the compiled-level cache")


DMLAB = Family(
    title="the DeepMind Lab family",
    matches=_is_dmlab_name,
    make=make_dmlab_env,
    known=("dmlab_<level>", "dmlab_30"),
    names_help="dmlab_<level>, dmlab_30",
    problem=lambda name, cfg=None: (None if _module_available("deepmind_lab")
                                    else (ImportError, _dmlab_install_line(name))),
    flag_defaults={"env_frameskip": DEFAULT_FRAMESKIP, "gamma": DEFAULT_GAMMA,
                   "encoder": "resnet"},  # the IMPALA and Sample Factory papers' DMLab-30 encoder
    add_flags=add_dmlab_flags,
)


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


# ------------------------------------------------------------------------------------------------
# Any Gymnasium env by id: gym:<id>
# ------------------------------------------------------------------------------------------------
# The smallest family, and the one to copy when adding your own: a name test, a problem check, a
# factory with the two wrappers every family shares (GameStatsRecorder innermost, TrainerInterface
# outermost), and its record in FAMILIES with its defaults and flags.

def _is_gym_name(name: str) -> bool:
    return name.startswith("gym:") and len(name) > len("gym:")


def _gym_registry_id(name: str) -> str:
    """The registry id of gym:<id>, or of gym:<module>:<id>, Gymnasium's own way to name an env of a
    module that registers it: the module is imported first, as gymnasium.make does (ImportError if
    it is not on the Python path)."""
    env_id = name[len("gym:"):]
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        importlib.import_module(module)
    return env_id


def _unknown_gym_id(name: str) -> tuple[type[Exception], str] | None:
    try:
        env_id = _gym_registry_id(name)
    except ImportError as error:
        module = name[len("gym:"):].split(":")[0]
        return ValueError, (f"--env {name}: cannot import {module!r} ({error}); the module that registers "
                            "the env must be on the Python path: run from its folder or set PYTHONPATH")
    if env_id in gym.registry:
        return None
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return ValueError, (f"unknown Gymnasium id {env_id!r} in --env {name}: {hint}python -c 'import gymnasium; "
                        "gymnasium.pprint_registry()' lists the registered ids; an env of your own: register it "
                        "with gymnasium.register in a module and name it gym:<module>:<id> (docs/fork.md: bring "
                        "your own env)")


def make_gym_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    kwargs = json.loads(getattr(cfg, "env_kwargs", None) or "{}")
    if render_mode is not None:  # only when asked: an env of the user's may not take the argument
        kwargs["render_mode"] = render_mode
    env = gym.make(name[len("gym:"):], **kwargs)
    if getattr(cfg, "obs_keys", None):  # the Dict keys appo.py is to see (MiniGrid's text mission left out, say)
        env = gym.wrappers.FilterObservation(env, cfg.obs_keys)
    env = GymObservations(env)
    stats = env = GameStatsRecorder(env, frames_per_step=1)  # one frame per step: no frameskip here
    return TrainerInterface(env, stats, seed=_run_seed(cfg, env_index))


def _gym_problem(name: str, cfg=None) -> Problem:
    if getattr(cfg, "env_frameskip", None) not in (None, 1):
        return ValueError, (f"--env_frameskip {cfg.env_frameskip} with --env {name}: gym: envs take one step per "
                            "action; register a frame-skipping wrapper of your env as an id of its own instead")
    return _unknown_gym_id(name)


def _gym_game_fps(name: str) -> float:
    """The env class's own, where it says (MuJoCo's set theirs per instance)."""
    creator = gym.envs.registration.load_env_creator(gym.registry[_gym_registry_id(name)].entry_point)
    return float(getattr(creator, "metadata", {}).get("render_fps") or 30.0)


def add_gym_flags(group) -> None:
    group.add_argument("--env_kwargs", default=None,
                       help="gym:<id> and pz: envs: keyword arguments for gymnasium.make or the pz: factory, "
                            'as JSON, e.g. \'{"continuous": true}\'')
    group.add_argument("--obs_keys", nargs="+", default=None,
                       help="gym:<id> envs that observe a Dict: the keys the model sees, the others left out "
                            "(MiniGrid: --obs_keys image direction, without its text mission)")


def gym_flag_errors(cfg) -> list[str]:
    if cfg.env_kwargs is not None:
        try:
            if not isinstance(json.loads(cfg.env_kwargs), dict):
                raise ValueError("not an object")
        except ValueError as error:
            return [f"--env_kwargs must be a JSON object such as '{{\"continuous\": true}}' ({error})"]
    return []


# The gym: and pz: families' time limits: bootstrapped (mujoco_params.py's value_bootstrap, and our
# measurement by the rule R0 on HalfCheetah, Walker2d, Hopper and LunarLander: docs/results/learning.md,
# "Time limits bootstrapped"), for vector and image observations alike.
GYM_TIME_LIMITS = {"value_bootstrap": True}
# sf_examples/mujoco/mujoco_params.py, Sample Factory's continuous-control configuration, for gym:
# envs that observe vectors (its policy is a Gaussian on a Box, categoricals otherwise). Not as there:
# its KL penalty (kl_loss_coeff 0.1; appo.py has none); torch's default initialization; its
# iteration, 4,096 samples in minibatches of 1,024 under Sample Factory 2.x's meaning of batch_size,
# where ours is 1,024 in minibatches of 256 (its numbers read under appo.py's meaning before 743911e),
# 4x the SGD steps a sample. The ablation behind issue 80 measures these.
GYM_VECTOR_DEFAULTS = {
    "env_frameskip": 1, "gamma": DEFAULT_GAMMA, "encoder_mlp_layers": [64, 64], "nonlinearity": "tanh",
    "hidden_size": 64, "rnn_type": "none", "rollout": 64, "batch_size": 256, "num_epochs": 2,
    "num_batches_per_epoch": 4, "with_vtrace": False, "ppo_clip_ratio": 0.2, "value_loss_coeff": 1.3,
    "exploration_loss_coeff": 0.0, "learning_rate": 0.00295, "lr_schedule": "linear_decay", "max_grad_norm": 3.5,
    "normalize_input": True, "async_rl": False,
    "train_for_env_steps": 10_000_000,  # mujoco_params.py's budget, and so its schedule's horizon
    **GYM_TIME_LIMITS,
}
# gym: envs that observe images: appo.py's own defaults, Sample Factory's cfg.py configuration for
# pixels (the conv encoder, a GRU, asynchronous collection), one step per action
GYM_IMAGE_DEFAULTS = {"env_frameskip": 1, "gamma": DEFAULT_GAMMA, **GYM_TIME_LIMITS}


# Images smaller than this on a side get --encoder convnet_small: appo.py's default encoder,
# convnet_simple (kernels 8, 4, 3 at strides 4, 2, 2), needs 36x36 (appo.encoder_errors says so).
SMALL_IMAGE_SIDE = 36


# gym: envs that observe images under SMALL_IMAGE_SIDE (MiniGrid's 7x7 views): rl-starter-files'
# MiniGrid PPO (scripts/train.py's defaults: a small conv encoder, no memory, 2,048 frames an update
# in 4 epochs of minibatches of 256, lr 1e-3, entropy 0.01, grad clip 0.5, GAE 0.95, clip 0.2), with
# --normalize_input added: appo.py scales uint8 images by 1/255, and MiniGrid's cells are small
# integers (object, colour, state), which that scale would leave at a few hundredths.
GYM_SMALL_IMAGE_DEFAULTS = {
    **GYM_IMAGE_DEFAULTS, "encoder": "convnet_small", "rnn_type": "none", "with_vtrace": False,
    "batch_size": 256, "num_batches_per_epoch": 8, "num_epochs": 4, "learning_rate": 0.001,
    "exploration_loss_coeff": 0.01, "max_grad_norm": 0.5, "ppo_clip_ratio": 0.2, "gae_lambda": 0.95,
    "normalize_input": True,
}


def _gym_defaults(name: str) -> dict:
    """The gym: family's rule: vector observations get its vector defaults, images appo.py's own,
    and images too small for appo.py's default encoder (MiniGrid's 7x7 views) the small-image ones."""
    side = _gym_smallest_image_side(name)
    if side is None:
        return GYM_VECTOR_DEFAULTS
    return GYM_SMALL_IMAGE_DEFAULTS if side < SMALL_IMAGE_SIDE else GYM_IMAGE_DEFAULTS


@functools.lru_cache(maxsize=None)
def _gym_smallest_image_side(name: str) -> int | None:
    """The smallest side of the images gym:<id> observes (an H x W x C uint8 Box, alone or in a
    Dict), None where it observes none. Its registry entry does not say, so one env is made and
    closed; one that cannot be made counts as a vector env (the family's problem check names what
    is wrong)."""
    try:
        env = gym.make(name[len("gym:"):])
    except Exception:
        return None
    try:
        space = env.observation_space
    finally:
        env.close()
    subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else [space]
    sides = [min(subspace.shape[:2]) for subspace in subspaces if _is_image_space(subspace)]
    return min(sides) if sides else None


def _any_subspace(space: spaces.Space, test: Callable[[spaces.Box], bool]) -> bool:
    """Does a Box observation, or any Box of a Dict of them, pass `test`?"""
    subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else [space]
    return any(isinstance(subspace, spaces.Box) and test(subspace) for subspace in subspaces)


GYM = Family(
    title="the gym: family",
    matches=_is_gym_name,
    make=make_gym_env,
    known=("gym:<id> (any registered Gymnasium env)",),
    names_help="gym:<id> for any registered Gymnasium env (e.g. gym:CartPole-v1; gym:<module>:<id> imports <module> first)",
    problem=_gym_problem,
    flag_defaults=_gym_defaults,
    game_fps=_gym_game_fps,
    add_flags=add_gym_flags,
    flag_errors=gym_flag_errors,
    trained_flags=("env_kwargs", "obs_keys"),
)


class GymObservations(gym.ObservationWrapper):
    """Observations as appo.py's encoders take them (ObservationConverter)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._converter = ObservationConverter(env.observation_space)
        self.observation_space = self._converter.space

    def observation(self, obs):
        return self._converter(obs)


class ObservationConverter:
    """Observations of `space` as appo.py's encoders take them: uint8 images (H, W, C) to CHW for
    the conv encoder, every other Box or MultiBinary (an action mask, often) flattened to a float32
    vector for the MLP, a Discrete one-hot; a Dict key by key. `space` is the converted space."""

    def __init__(self, space: spaces.Space):
        subspaces = space.spaces if isinstance(space, spaces.Dict) else {None: space}
        takes = (spaces.Box, spaces.MultiBinary, spaces.Discrete)
        for key, subspace in subspaces.items():
            if not isinstance(subspace, takes):
                usable = [name for name, other in subspaces.items() if isinstance(other, takes)]
                fix = (f"keep the others with --obs_keys {' '.join(usable)} (gym: envs)" if key is not None and usable
                       else "give the env a wrapper that observes a Box (docs/fork.md: bring your own env)")
                raise ValueError(f"observation {repr(key) + ' ' if key else ''}is a {type(subspace).__name__}, which "
                                 "appo.py cannot encode (it takes Box observations, images or vectors, MultiBinary "
                                 f"or Discrete ones, or a Dict of them): {fix}")
        self._subspaces = subspaces
        converted = {key: _trainer_space(subspace) for key, subspace in subspaces.items()}
        self.space = spaces.Dict(converted) if None not in converted else converted[None]

    def __call__(self, obs):
        if not isinstance(obs, dict):
            return self._convert(None, obs)
        return {key: self._convert(key, value) for key, value in obs.items()}

    def _convert(self, key, value):
        subspace = self._subspaces[key]
        if isinstance(subspace, spaces.Discrete):
            one_hot = np.zeros(int(subspace.n), np.float32)
            one_hot[int(value) - int(subspace.start)] = 1.0
            return one_hot
        if _is_image_space(subspace):
            return np.ascontiguousarray(np.transpose(value, (2, 0, 1)))
        return np.asarray(value, dtype=np.float32).reshape(-1)


def _is_image_space(space: spaces.Space) -> bool:
    return (isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and space.shape[2] in (1, 3, 4))


def _trainer_space(space: spaces.Box | spaces.MultiBinary | spaces.Discrete) -> spaces.Box:
    if isinstance(space, spaces.Discrete):
        return spaces.Box(0.0, 1.0, (int(space.n),), np.float32)
    if isinstance(space, spaces.MultiBinary):
        return spaces.Box(0.0, 1.0, (int(np.prod(space.shape)),), np.float32)
    if _is_image_space(space):
        height, width, channels = space.shape
        return spaces.Box(0, 255, (channels, height, width), np.uint8)
    return spaces.Box(space.low.reshape(-1).astype(np.float32), space.high.reshape(-1).astype(np.float32),
                      dtype=np.float32)


# ------------------------------------------------------------------------------------------------
# PettingZoo parallel envs: pz:<module>:<factory>
# ------------------------------------------------------------------------------------------------
# Every agent of a ParallelEnv is one of appo.py's agents, all stepped at once, as in the Doom
# matches. Agents that share their (observation, action) spaces form a group, and each group has
# policies of its own (appo.py's groups): predators and prey, a speaker and a listener. With
# --num_policies N each agent plays for a policy of its group drawn at random, as in the matches.

def _is_pz_name(name: str) -> bool:
    return name.startswith("pz:") and name.count(":") >= 2


def _pz_factory(name: str) -> Callable:
    """The factory of pz:<module>:<factory>, its module imported (ImportError, AttributeError)."""
    module, factory = name[len("pz:"):].rsplit(":", 1)
    return getattr(importlib.import_module(module), factory)


def make_pettingzoo_env(name: str, cfg=None, env_index: int = 0, render_mode: str | None = None) -> gym.Env:
    kwargs = json.loads(getattr(cfg, "env_kwargs", None) or "{}")
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return PettingZooAgents(_pz_factory(name)(**kwargs), seed=_run_seed(cfg, env_index))


def _pz_problem(name: str, cfg=None) -> Problem:
    if not _module_available("pettingzoo"):
        return ImportError, f"--env {name} needs PettingZoo: pip install -e .[pettingzoo]"
    if getattr(cfg, "env_frameskip", None) not in (None, 1):
        return ValueError, f"--env_frameskip {cfg.env_frameskip} with --env {name}: pz: envs take one step per action"
    return _pz_env_problem(name, getattr(cfg, "env_kwargs", None))


@functools.lru_cache(maxsize=None)
def _pz_env_problem(name: str, env_kwargs: str | None) -> Problem:
    """What one env made with the run's --env_kwargs says: a factory that cannot be found, an AEC
    env, not a ParallelEnv. The env is made once and closed."""
    try:
        factory = _pz_factory(name)
    except (ImportError, AttributeError) as error:
        return ValueError, (f"--env {name}: cannot find the factory ({error}); name it pz:<module>:<factory>, e.g. "
                            "pz:pettingzoo.classic.rps_v2:parallel_env, with the module on the Python path")
    try:
        env = factory(**json.loads(env_kwargs or "{}"))
    except Exception as error:  # the user's factory: whatever it raises is theirs to read
        return ValueError, f"--env {name}: the factory failed ({type(error).__name__}: {error})"
    try:
        return _pz_spaces_problem(name, env)
    finally:
        env.close()


def _pz_spaces_problem(name: str, env) -> Problem:
    from pettingzoo import AECEnv, ParallelEnv

    if isinstance(env, AECEnv):
        fix = ("or convert it with pettingzoo.utils.aec_to_parallel in a factory of yours"
               if env.metadata.get("is_parallelizable") else "if it has one: this one says it cannot step in parallel")
        return ValueError, (f"--env {name} makes an AEC env (agents act in turn), and appo.py steps every agent at once: "
                            f"give the module's parallel_env factory, {fix}")
    if not isinstance(env, ParallelEnv):
        return ValueError, f"--env {name} makes a {type(env).__name__}, not a PettingZoo ParallelEnv"
    return None


@functools.lru_cache(maxsize=None)
def _pz_metadata_and_spaces(name: str) -> tuple[dict, spaces.Space, int] | None:
    """(metadata, first agent's observation space, number of groups of agents) of one env made with
    no flags and closed; None if it cannot be made (the problem check says why)."""
    try:
        env = _pz_factory(name)()
    except Exception:  # the problem check says what is wrong
        return None
    try:
        agents = env.possible_agents
        pairs = [(env.observation_space(agent), env.action_space(agent)) for agent in agents]
        return dict(env.metadata), pairs[0][0], len(space_groups(pairs)[0])
    finally:
        env.close()


def _pz_defaults(name: str) -> dict:
    """The gym: family's rule: vector observations get its vector defaults, images appo.py's own.
    An env whose agents form several groups gets a policy per group, and collects asynchronously:
    its groups feed different learners, and --no-async_rl's one batch is one policy's."""
    made = _pz_metadata_and_spaces(name)
    images = made is not None and _any_subspace(made[1], _is_image_space)
    defaults = dict(GYM_IMAGE_DEFAULTS if images else GYM_VECTOR_DEFAULTS)
    if made is not None and made[2] > 1:
        defaults.update(num_policies=made[2], async_rl=True)
    return defaults


def _pz_game_fps(name: str) -> float:
    made = _pz_metadata_and_spaces(name)
    return float((made[0].get("render_fps") if made else None) or 30.0)


class PettingZooAgents(gym.Env):
    """A PettingZoo ParallelEnv as this file's multi-agent envs are: lists with one entry per agent
    of possible_agents, observations converted as for gym: envs (ObservationConverter), each
    agent's spaces in agent_spaces (observation_space and action_space are the first agent's).

    Each agent's termination and truncation stay apart, as gymnasium's. An agent not in the game
    (it left early, or has not joined) is given its last observation (or zeros), reward 0,
    terminated, and "agent_left" in its info: the rollout worker keeps such steps out
    of the loss, and the action the policy picks for it is not passed to the env. Each agent's
    game stats (true_return, true_length) are reported when the whole game ends. With one agent it
    speaks the single-agent API, as appo.py expects of an env with num_agents 1."""

    def __init__(self, env, seed: int | None):
        self.env, self.agent_names = env, list(env.possible_agents)
        self.num_agents = len(self.agent_names)
        self._converters = {agent: ObservationConverter(env.observation_space(agent)) for agent in self.agent_names}
        self.agent_spaces = [(self._converters[agent].space, env.action_space(agent)) for agent in self.agent_names]
        self.observation_space, self.action_space = self.agent_spaces[0]
        self.render_mode = getattr(env, "render_mode", None)
        self._first_seed = seed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        seed, self._first_seed = (self._first_seed if seed is None else seed), None
        obs, _ = self.env.reset(seed=seed, options=options)
        self._last_obs = {agent: self._converters[agent](obs[agent]) if agent in obs else self._empty_obs(agent)
                          for agent in self.agent_names}
        self._returns, self._length = dict.fromkeys(self.agent_names, 0.0), 0
        obs = [self._last_obs[agent] for agent in self.agent_names]
        return (obs[0] if self.num_agents == 1 else obs), {}

    def step(self, actions):
        if self.num_agents == 1:
            return tuple(values[0] for values in self._step([actions]))
        return self._step(actions)

    def _step(self, actions: list):
        playing = set(self.env.agents)
        obs, rewards, terminations, truncations, infos = self.env.step(
            {agent: action for agent, action in zip(self.agent_names, actions) if agent in playing})
        self._length += 1
        step_rewards, ends, cuts, step_infos = [], [], [], []
        for agent in self.agent_names:
            if agent in obs:
                self._last_obs[agent] = self._converters[agent](obs[agent])
            reward = float(rewards.get(agent, 0.0))
            self._returns[agent] += reward
            step_rewards.append(reward)
            ends.append(agent not in playing or bool(terminations.get(agent)))
            cuts.append(agent in playing and not ends[-1] and bool(truncations.get(agent)))  # by a time limit
            step_infos.append(dict(infos.get(agent, {})) if agent in playing else {"agent_left": True})
        if not self.env.agents:  # the game is over for everyone
            for agent, info in zip(self.agent_names, step_infos):
                info.update(true_return=self._returns[agent], true_length=self._length,
                            true_objective=self._returns[agent])
        return [self._last_obs[agent] for agent in self.agent_names], step_rewards, ends, cuts, step_infos

    def _empty_obs(self, agent: str):
        space = self._converters[agent].space
        return ({key: np.zeros(sub.shape, sub.dtype) for key, sub in space.spaces.items()}
                if isinstance(space, spaces.Dict) else np.zeros(space.shape, space.dtype))

    def render(self):
        return self.env.render()

    def close(self):
        self.env.close()


PETTINGZOO = Family(
    title="the pz: family",
    matches=_is_pz_name,
    make=make_pettingzoo_env,
    known=("pz:<module>:<factory> (a PettingZoo ParallelEnv)",),
    names_help="pz:<module>:<factory> for a PettingZoo ParallelEnv",
    problem=_pz_problem,
    flag_defaults=_pz_defaults,
    game_fps=_pz_game_fps,
    num_agents=lambda name: None,  # known once one is made
    trained_flags=("env_kwargs",),
)


# ------------------------------------------------------------------------------------------------
# The registry: every built-in family, in the order names are matched (register_env puts a
# forker's envs in front)
# ------------------------------------------------------------------------------------------------

FAMILIES += [DOOM, DOOM_MATCH, ATARI, DMLAB, GYM, PETTINGZOO]
