#!/usr/bin/env python
"""Do two ale-py versions play a game the same way? Run this under each interpreter (appo.py's
and Sample Factory's venv, which pins an older ale-py) and compare the lines they print.

It plays --frames frames of random actions (a fixed seed, so both runs press the same buttons)
on the bare ALE env: frameskip 1, no sticky actions, no wrappers, the same reset seed after every
game over. It prints the total reward, the games finished and a hash of every frame's console RAM
(the emulator's whole game state): equal hashes mean the two versions emulate the game
identically for those actions. The wrappers' random no-op starts are left out on purpose: they
draw from each version's own RNG stream, which does differ.

    python scripts/ale_version_parity.py
    /work/sf-venv/bin/python scripts/ale_version_parity.py
"""
import argparse
import hashlib

import gymnasium as gym
import numpy as np


def play(game: str, frames: int, seed: int) -> tuple[float, int, str]:
    """(total reward, games finished, RAM hash) of `frames` random actions on ALE/<game>-v5."""
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0, obs_type="ram",
                   full_action_space=False)
    env.reset(seed=seed)
    actions = np.random.default_rng(seed)
    ram_hash, total, games = hashlib.sha256(), 0.0, 0
    for _ in range(frames):
        ram, reward, terminated, truncated, _ = env.step(int(actions.integers(env.action_space.n)))
        ram_hash.update(ram.tobytes())
        total += reward
        if terminated or truncated:
            games += 1
            env.reset(seed=seed)
    env.close()
    return total, games, ram_hash.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", default="Breakout,SpaceInvaders", help="comma-separated ALE game names")
    parser.add_argument("--frames", type=int, default=20000, help="frames to play per game (frameskip 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the actions and of every reset")
    args = parser.parse_args()

    import ale_py
    if hasattr(gym, "register_envs"):  # gymnasium 1.x registers the ALE ids only when asked
        gym.register_envs(ale_py)
    for game in args.games.split(","):
        total, games, digest = play(game, args.frames, args.seed)
        print(f"ale-py {ale_py.__version__}  {game}: {args.frames} frames, reward {total:g}, "
              f"{games} games over, RAM hash {digest}")


if __name__ == "__main__":
    main()
