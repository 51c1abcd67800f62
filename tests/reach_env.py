"""The env of docs/fork.md's "Bring your own env" example, as a module that `--env
gym:reach_env:MyFork/Reach-v0` imports in every process: a point moved towards the origin by a
Box action, rewarded by minus its distance. Random play averages about -40 a game; moving straight
at the origin, about -2.4."""
import gymnasium as gym
import numpy as np


class Reach(gym.Env):  # move a point to the origin
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-0.1, 0.1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.point, self.steps = self.np_random.uniform(-1, 1, 2).astype(np.float32), 0
        return self.point, {}

    def step(self, action):
        self.point, self.steps = np.clip(self.point + action, -1, 1).astype(np.float32), self.steps + 1
        return self.point, -float(np.linalg.norm(self.point)), False, self.steps == 50, {}


gym.register("MyFork/Reach-v0", entry_point=Reach)
