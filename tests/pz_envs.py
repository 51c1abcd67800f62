"""PettingZoo ParallelEnvs for the pz: family's tests, named pz:pz_envs:<factory>. Each raises on
what PettingZoo's API forbids or the env does not allow, so that a test sees it as a failed env."""
import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

GAME_STEPS = 12
LEAVES_AFTER = 4
LIMIT_STEPS = 3


class MaskedAndLeaving(ParallelEnv):
    """Three agents pick one of 5 actions each step, of which their mask allows two (a reward for
    the lower one). Agent "c" leaves after LEAVES_AFTER steps; the game ends after GAME_STEPS.
    step() raises on a forbidden action and on an action for an agent no longer in the game."""
    metadata = {"name": "masked_and_leaving_v0", "render_fps": 10}

    def __init__(self, render_mode=None):
        self.possible_agents = ["a", "b", "c"]
        self.render_mode = render_mode

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(0.0, 1.0, (5,), np.float32),
                            "action_mask": spaces.Box(0, 1, (5,), np.int8)})

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return spaces.Discrete(5)

    def reset(self, seed=None, options=None):
        if seed is not None or not hasattr(self, "rng"):  # later games go on from the first's seed
            self.rng = np.random.default_rng(seed)
        self.agents, self.steps = list(self.possible_agents), 0
        return self.observe(), {agent: {} for agent in self.agents}

    def observe(self):
        self.masks = {}
        for agent in self.agents:
            mask = np.zeros(5, np.int8)
            mask[self.rng.choice(5, 2, replace=False)] = 1
            self.masks[agent] = mask
        return {agent: {"observation": mask.astype(np.float32), "action_mask": mask}
                for agent, mask in self.masks.items()}

    def step(self, actions):
        if set(actions) != set(self.agents):
            raise ValueError(f"actions for {sorted(actions)}, and the agents in the game are {self.agents}")
        for agent, action in actions.items():
            if not self.masks[agent][action]:
                raise ValueError(f"agent {agent} took action {action}, which its mask {self.masks[agent]} forbids")
        rewards = {agent: float(action == np.flatnonzero(self.masks[agent])[0]) for agent, action in actions.items()}
        self.steps += 1
        over = self.steps == GAME_STEPS
        terminations = {agent: over or (agent == "c" and self.steps == LEAVES_AFTER) for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not terminations[agent]]
        return self.observe(), rewards, terminations, truncations, infos

    def render(self):
        """A 48x64 picture of the masks: a row per agent, its two allowed actions lit."""
        if self.render_mode != "rgb_array":
            return None
        picture = np.zeros((48, 64, 3), np.uint8)
        for row, agent in enumerate(self.possible_agents):
            for action in np.flatnonzero(self.masks.get(agent, np.zeros(5))):
                picture[16 * row:16 * row + 12, 12 * action:12 * action + 10] = 255
        return picture


class UnequalSpaces(MaskedAndLeaving):
    """MaskedAndLeaving, but agent "c" (which leaves after LEAVES_AFTER steps) sees one more value
    than "a" and "b", the last always 1: two groups of agents, each needing a policy of its own."""

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(0.0, 1.0, (6 if agent == "c" else 5,), np.float32),
                            "action_mask": spaces.Box(0, 1, (5,), np.int8)})

    def observe(self):
        obs = super().observe()
        if "c" in obs:
            obs["c"]["observation"] = np.append(obs["c"]["observation"], np.float32(1.0))
        return obs


class ScoresEveryStep(UnequalSpaces):
    """UnequalSpaces, but every agent in the game scores 1 each step, whatever (allowed) action it
    takes: a and b score GAME_STEPS a game, c (which leaves after LEAVES_AFTER steps) LEAVES_AFTER."""

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = super().step(actions)
        return obs, {agent: 1.0 for agent in rewards}, terminations, truncations, infos


class TimeLimited(ParallelEnv):
    """Three agents, each seeing the number of steps it has taken. After LIMIT_STEPS steps "cut"
    is truncated (a time limit) and "ends" terminated, and "stays" plays on to GAME_STEPS."""
    metadata = {"name": "time_limited_v0", "render_fps": 10}

    def __init__(self, render_mode=None):
        self.possible_agents, self.render_mode = ["cut", "ends", "stays"], render_mode

    def observation_space(self, agent):
        return spaces.Box(0.0, 100.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.steps = list(self.possible_agents), 0
        return self.observe(), {agent: {} for agent in self.agents}

    def observe(self):
        return {agent: np.full(1, self.steps, np.float32) for agent in self.agents}

    def step(self, actions):
        self.steps += 1
        obs = self.observe()
        rewards = {agent: 1.0 for agent in self.agents}
        terminations = {agent: (agent == "ends" and self.steps == LIMIT_STEPS) or self.steps == GAME_STEPS
                        for agent in self.agents}
        truncations = {agent: agent == "cut" and self.steps == LIMIT_STEPS for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (terminations[agent] or truncations[agent])]
        return obs, rewards, terminations, truncations, {agent: {} for agent in obs}


class Pictures(TimeLimited):
    """TimeLimited, but each agent sees a 40x40 RGB picture (a uint8 image: the pz: family's image
    defaults), lit by the number of steps it has taken."""

    def observation_space(self, agent):
        return spaces.Box(0, 255, (40, 40, 3), np.uint8)

    def observe(self):
        return {agent: np.full((40, 40, 3), self.steps, np.uint8) for agent in self.agents}


def time_limited(**kwargs):
    return TimeLimited(**kwargs)


def pictures(**kwargs):
    return Pictures(**kwargs)


def masked_and_leaving(**kwargs):
    return MaskedAndLeaving(**kwargs)


def unequal_spaces(**kwargs):
    return UnequalSpaces(**kwargs)


def scores_every_step(**kwargs):
    return ScoresEveryStep(**kwargs)
