"""A Gymnasium env, imported by every process through `--env gym:dies_at_startup_env:DiesAtStartup-v0`,
whose construction SIGKILLs the process that makes it, as many times in all as $DIE_AT_STARTUP_TIMES
says, counted across processes by files in $DIE_AT_STARTUP_DIR (each death claims one with
O_EXCL): a worker lost during start-up, before it could say it was ready."""
import os
import signal

import gymnasium as gym
import numpy as np


def claim_a_death() -> bool:
    folder, times = os.environ.get("DIE_AT_STARTUP_DIR"), int(os.environ.get("DIE_AT_STARTUP_TIMES", "0"))
    for k in range(times):
        try:
            os.close(os.open(os.path.join(folder, f"death_{k}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            continue
    return False


class DiesAtStartup(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        if claim_a_death():
            os.kill(os.getpid(), signal.SIGKILL)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


gym.register("DiesAtStartup-v0", entry_point=DiesAtStartup)
