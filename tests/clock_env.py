"""Envs for the time-limit tests, as `--env gym:clock_env:Clock/<id>` (imported in every process).
Every step is rewarded 1, and an episode ends after LIMIT steps, cut by gymnasium's TimeLimit
(Clock/Cut-v0: truncated) or by the game itself (Clock/Ends-v0: terminated). The observation is
(steps taken % LIMIT, episodes begun % 2): the final one looks like a first one, so a critic has
seen it, and the episode's parity tells it from the next episode's first. With the critic's value a
constant c = 1 / (1 - gamma), every step's return target is c where a cut is bootstrapped, and 1 at
the last step where the episode ends."""
import gymnasium as gym
import numpy as np

LIMIT = 4


class Clock(gym.Env):
    observation_space = gym.spaces.Box(0.0, 100.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ends: bool = False):
        self.ends, self.steps, self.episodes = ends, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.episodes = 0, self.episodes + 1
        return self.observe(), {}

    def observe(self) -> np.ndarray:
        return np.array([self.steps % LIMIT, self.episodes % 2], np.float32)

    def step(self, action):
        self.steps += 1
        return self.observe(), 1.0, self.ends and self.steps == LIMIT, False, {}


class UnevenClock(Clock):
    """Clock/Uneven-v0: its own time limit, LIMIT steps or one more by the parity of the seed of its
    first reset, so that two envs of a worker (seeded one apart) cut their episodes at different
    steps."""

    limit = LIMIT

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.limit = LIMIT + seed % 2
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, terminated, self.steps == self.limit, info


gym.register("Clock/Cut-v0", entry_point=Clock, max_episode_steps=LIMIT)
gym.register("Clock/Uneven-v0", entry_point=UnevenClock)
gym.register("Clock/Ends-v0", entry_point=Clock, kwargs={"ends": True})
