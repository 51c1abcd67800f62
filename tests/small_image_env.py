"""A small-image env of our own, as MiniGrid's are (a 7x7 RGB view and a text mission in a Dict),
as a module that `--env gym:small_image_env:SmallView-v0` imports in every process: one cell of
the view's middle row, at its left or right edge, is lit; action 0 (left) or 1 (right) towards it
scores 1, anything else 0. Twenty steps a game: random play among the three actions averages about
6.7, a policy that reads the picture 20."""
import gymnasium as gym
import numpy as np


class SmallView(gym.Env):
    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
                                         "mission": gym.spaces.Text(max_length=32)})
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observe(), {}

    def observe(self):
        self.side = int(self.np_random.integers(2))
        image = np.zeros((7, 7, 3), np.uint8)
        image[3, 6 * self.side] = 255
        return {"image": image, "mission": "go towards the light"}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.steps += 1
        return self.observe(), reward, False, self.steps == 20, {}


gym.register("SmallView-v0", entry_point=SmallView)
