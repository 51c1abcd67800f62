"""docs/fork.md's constrained-policy example env, as a module that `--env gym:costly_env:Costly-v0`
imports: action 1 scores 1 and costs 1, action 0 scores 0.5 and costs nothing; the cost comes in
the step's info, as Safety-Gymnasium reports it. Twenty steps a game: random play scores about
15, the highest-scoring policy 20, the best one once each unit of cost is worth 1 of score, 10."""
import gymnasium as gym
import numpy as np


class Costly(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        costly = int(action) == 1
        return (np.zeros(2, np.float32), 1.0 if costly else 0.5, False, self.steps == 20,
                {"cost": 1.0 if costly else 0.0})


gym.register("Costly-v0", entry_point=Costly)
