"""A stand-in for the `deepmind_lab` module, used by tests/test_env.py.

It stands in because deepmind_lab cannot be installed on this machine: it has no PyPI wheel and
must be built from source with Bazel. The stand-in copies the documented Python API that env.py
uses (Lab(level, observations, config=, renderer=, level_cache=), reset(seed=),
step(action, num_steps=), is_running(), observations(), close()), checks its arguments the way
DMLab does, and records every call so that tests can see what env.py asked for.

Its episodes last EPISODE_FRAMES frames. Each frame moving forward earns a reward of 1; the
image is filled with (frames played so far) % 256.
"""

import os
import tempfile

import numpy as np

EPISODE_FRAMES = 40
ACTION_SIZE = 7  # look left/right, look down/up, strafe, move back/forward, fire, jump, crouch


class Lab:
    created: list["Lab"] = []  # every instance, newest last

    def __init__(self, level, observations, config=None, renderer="software", level_cache=None):
        assert observations == ["RGB_INTERLEAVED"], observations
        assert all(isinstance(value, str) for value in config.values()), "DMLab config values are strings"
        assert renderer in ("software", "hardware")
        self.level = level
        self.config = config
        self.width, self.height = int(config["width"]), int(config["height"])
        self.step_calls: list[tuple[np.ndarray, int]] = []
        self.reset_seeds: list[int] = []
        self.closed = False
        self.level_cache_hit = self._load_level(level_cache)
        self._frame = 0
        self._running = False
        Lab.created.append(self)

    def _load_level(self, level_cache) -> bool | None:
        """Like DMLab: ask the cache for the compiled level, else 'compile' it and offer it to the cache."""
        if level_cache is None:
            return None
        key = self.level.replace("/", "_") + ".pk3"
        with tempfile.TemporaryDirectory() as build_dir:  # DMLab's own scratch folder, gone after loading
            pk3_path = os.path.join(build_dir, key)
            if level_cache.fetch(key, pk3_path):
                with open(pk3_path, "rb") as pk3:
                    assert pk3.read() == b"compiled " + self.level.encode()
                return True
            with open(pk3_path, "wb") as pk3:
                pk3.write(b"compiled " + self.level.encode())
            level_cache.write(key, pk3_path)
            return False

    def reset(self, episode=-1, seed=None):
        assert seed is None or 0 <= seed < 2**31
        self.reset_seeds.append(seed)
        self._frame = 0
        self._running = True
        return True

    def step(self, action, num_steps=1):
        assert self._running, "step() after the episode ended"
        assert isinstance(action, np.ndarray) and action.dtype == np.intc and action.shape == (ACTION_SIZE,)
        self.step_calls.append((action.copy(), num_steps))
        frames = min(num_steps, EPISODE_FRAMES - self._frame)
        self._frame += frames
        if self._frame >= EPISODE_FRAMES:
            self._running = False
        moving_forward = action[3] == 1
        return float(frames) if moving_forward else 0.0

    def is_running(self):
        return self._running

    def observations(self):
        if not self._running:
            raise RuntimeError("Environment is not running")  # as DMLab does after the episode ends
        image = np.full((self.height, self.width, 3), self._frame % 256, dtype=np.uint8)
        return {"RGB_INTERLEAVED": image}

    def close(self):
        self.closed = True
        return True
