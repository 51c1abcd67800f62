"""Small envs of every standard action space, registered with Gymnasium so that `--env
gym:action_space_envs:<id>` imports this module in every process. Each raises on an action that its
space does not contain (or, Masked-v0, that its mask forbids): the rollout worker then reports the
env as failed, which the tests look for."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces

EPISODE_STEPS = 16


class CheckedEnv(gym.Env):
    """Episodes of EPISODE_STEPS steps; step() refuses what is not an action of the space."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observe(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"not an action of {self.action_space}: {action!r}")
        reward = self.reward(action)
        self.steps += 1
        return self.observe(), reward, False, self.steps == EPISODE_STEPS, {}


class Bits(CheckedEnv):
    """Copy the bits shown: a reward per bit that matches."""
    action_space = spaces.MultiBinary(4)
    observation_space = spaces.Box(0.0, 1.0, (4,), np.float32)

    def observe(self):
        self.target = self.np_random.integers(0, 2, 4)
        return self.target.astype(np.float32)

    def reward(self, action):
        return float((action == self.target).mean())


class Plane(CheckedEnv):
    """A 2 x 2 Box action: rewarded by minus its distance to the target shown."""
    action_space = spaces.Box(-1.0, 1.0, (2, 2), np.float32)
    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def observe(self):
        self.target = self.np_random.uniform(-0.5, 0.5, (2, 2)).astype(np.float32)
        return self.target.reshape(-1)

    def reward(self, action):
        return -float(np.abs(action - self.target).sum())


class Mixed(CheckedEnv):
    """A Dict action of a Discrete, a Box and a MultiBinary part, observed as an image and a vector."""
    action_space = spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Box(-1.0, 1.0, (2,), np.float32),
                                "buttons": spaces.MultiBinary(2)})
    observation_space = spaces.Dict({"screen": spaces.Box(0, 255, (36, 36, 3), np.uint8),
                                     "state": spaces.Box(-1.0, 1.0, (3,), np.float32)})

    def observe(self):
        self.state = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        screen = np.zeros((36, 36, 3), np.uint8)
        screen[:, :, 0] = int(127 * (self.state[0] + 1))
        return {"screen": screen, "state": self.state}

    def reward(self, action):
        return (float(action["move"] == 1) - float(np.abs(action["aim"] - self.state[:2]).sum())
                + float(action["buttons"][0]))


class Masked(CheckedEnv):
    """A Discrete(6) action of which the mask allows two each step (PettingZoo's action_mask key):
    random play takes a forbidden one at two steps in three, and this env raises when one is."""
    action_space = spaces.Discrete(6)
    mask_size = 6
    observation_space = spaces.Dict({"obs": spaces.Box(0.0, 1.0, (6,), np.float32),
                                     "action_mask": spaces.Box(0, 1, (mask_size,), np.int8)})

    def observe(self):
        self.mask = np.zeros(self.mask_size, np.int8)
        self.mask[self.np_random.choice(6, 2, replace=False)] = 1
        return {"obs": self.mask[:6].astype(np.float32), "action_mask": self.mask}

    def step(self, action):
        if self.action_space.contains(action) and not self.mask[action]:
            raise ValueError(f"action {action} is masked: {self.mask}")
        return super().step(action)

    def reward(self, action):
        return float(action == np.flatnonzero(self.mask)[0])


class WrongSizeMask(Masked):
    """A mask of 5 entries for 6 actions: refused before anything starts."""
    mask_size = 5
    observation_space = spaces.Dict({"obs": spaces.Box(0.0, 1.0, (5,), np.float32),
                                     "action_mask": spaces.Box(0, 1, (5,), np.int8)})

    def observe(self):
        self.mask = np.ones(5, np.int8)
        return {"obs": self.mask.astype(np.float32), "action_mask": self.mask}


for env_class in (Bits, Plane, Mixed, Masked, WrongSizeMask):
    gym.register(f"Spaces/{env_class.__name__}-v0", entry_point=env_class)
