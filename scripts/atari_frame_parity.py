#!/usr/bin/env python
"""Do appo.py and Sample Factory show the agent the same Atari frame? Plays random actions in one
game and, every --every frames, turns the same ALE screen into an 84x84 grey frame both ways:

  appo.py (env.py make_atari_env): the ALE's own greyscale screen, then ResizeFrame's area resize;
  Sample Factory 2.1.1 (sf_examples/atari/atari_utils.py): gym's ResizeObservation (OpenCV area
  resize) of the RGB screen, then GrayScaleObservation (OpenCV's RGB-to-grey).

It prints how far apart the two frames are, in grey levels of 256.

    python scripts/atari_frame_parity.py --game space_invaders
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import env as envs  # noqa: E402  (the repo's env.py: its frame size and its OpenCV)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="space_invaders", help="ALE rom id, e.g. breakout")
    parser.add_argument("--frames", type=int, default=2000, help="frames to play (frameskip 1)")
    parser.add_argument("--every", type=int, default=50, help="compare every this many frames")
    args = parser.parse_args()

    import gymnasium as gym
    cv2, size = envs.cv2, envs.ATARI_SIZE
    game = gym.make(envs._ale_env_id(f"atari_{args.game}"), frameskip=1, repeat_action_probability=0.0,
                    obs_type="rgb")
    game.reset(seed=0)
    ale, rng = game.unwrapped.ale, np.random.default_rng(0)
    appo_resize = envs.ResizeFrame(game, size).observation  # env.py's own resize, not a copy of it
    appo_frames, sf_frames = [], []
    for frame in range(args.frames):
        game.step(int(rng.integers(game.action_space.n)))
        if frame % args.every == 0:
            appo_frames.append(appo_resize(ale.getScreenGrayscale()))
            rgb = cv2.resize(ale.getScreenRGB(), (size, size), interpolation=cv2.INTER_AREA)
            sf_frames.append(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    difference = np.abs(np.array(appo_frames, np.int16) - np.array(sf_frames, np.int16))
    print(f"{args.game}: {len(appo_frames)} frames of {size}x{size}; grey levels apart: max {difference.max()}, "
          f"mean {difference.mean():.3f}; pixels that differ: {np.mean(difference > 0):.1%}")


if __name__ == "__main__":
    main()
