#!/usr/bin/env python
"""Plays one fixed action sequence in an env as appo.py makes it, or as Sample Factory makes it,
and prints what the game showed and paid, so that bench/bench_learning.py can check that both
trainers learn the same task.

    python bench/task_probe.py --trainer appo --env doom_basic --out appo.npz
    .venv-sf/bin/python bench/task_probe.py --trainer sf --env doom_basic --out sf.npz

Doom: it saves (--out, .npz) the game's own screen at every step (before any resizing, which
legitimately differs between the trainers), the training reward the learner sees and whether the
episode ended. Atari: the ALE's settings (ROM, sticky actions, frameskip, action set) and the
training rewards; the start no-ops are drawn from each trainer's own random generator, so the
screens are not comparable step by step. Runs in either interpreter: it imports only numpy and
the trainer's own env code.
"""
import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Doom: Sample Factory's first reset() shows the frame that game.init() left, where the status bar
# has not been drawn yet; from a few tics on, both trainers' screens are comparable.
SKIP_STEPS = 5


def appo_env(name: str, doom_scenarios_dir: str | None):
    sys.path.insert(0, REPO)
    import types

    import env as envs

    return envs.create_env(name, types.SimpleNamespace(doom_scenarios_dir=doom_scenarios_dir), env_index=0)


def sample_factory_env(name: str):
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args

    if name.startswith("doom_"):
        import sf_train_vizdoom_extra  # noqa: F401  (adds doom_take_cover; bench/setup_sample_factory.sh)
        from sf_examples.vizdoom.doom.doom_params import add_doom_env_args, doom_override_defaults
        from sf_examples.vizdoom.doom.doom_utils import doom_env_by_name, make_doom_env_from_spec

        parser, _ = parse_sf_args(["--env", name], evaluation=False)
        add_doom_env_args(parser)
        doom_override_defaults(parser)
        cfg = parse_full_cfg(parser, ["--env", name])
        return make_doom_env_from_spec(doom_env_by_name(name), name, cfg=cfg, env_config=None)
    import ale_py  # noqa: F401  (registers the ALE ids)
    from sf_examples.atari.atari_params import atari_override_defaults
    from sf_examples.atari.atari_utils import make_atari_env

    parser, _ = parse_sf_args(["--env", name], evaluation=False)
    atari_override_defaults(name, parser)
    cfg = parse_full_cfg(parser, ["--env", name])
    return make_atari_env(name, cfg, env_config=None)


def game_screen(env) -> np.ndarray:
    game = env.unwrapped
    if hasattr(game, "game"):  # VizDoom
        return np.asarray(game.game.get_state().screen_buffer)
    return np.asarray(game.ale.getScreenRGB())


def channels_last(screen: np.ndarray) -> np.ndarray:
    """Sample Factory's Doom renders CHW (CRCGCB), appo.py's HWC (RGB24): compare one layout."""
    return screen.transpose(1, 2, 0) if screen.ndim == 3 and screen.shape[0] == 3 else screen


def action_sampler(space, rng: np.random.Generator):
    """A function drawing the next action (an int, or a tuple for several heads), and the head sizes."""
    if hasattr(space, "spaces"):
        sizes = [int(s.n) for s in space.spaces]
        return lambda: tuple(int(rng.integers(n)) for n in sizes), sizes
    return lambda: int(rng.integers(space.n)), [int(space.n)]


def probe(env, steps: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sample, sizes = action_sampler(env.action_space, rng)
    env.reset(seed=seed)
    screens, rewards, dones = [], [], []
    for step in range(steps):
        _, reward, terminated, truncated, _ = env.step(sample())
        done = bool(terminated or truncated)
        if step >= SKIP_STEPS and not done:  # a finished Doom episode has no screen
            screens.append(channels_last(game_screen(env)))
        rewards.append(float(reward))
        dones.append(done)
        if done:
            env.reset()
    result = {"action_sizes": np.array(sizes), "rewards": np.array(rewards), "dones": np.array(dones)}
    game = env.unwrapped
    if hasattr(game, "ale"):
        result["ale"] = np.array([str(game.ale.getFloat("repeat_action_probability")), str(game.ale.getInt("frame_skip")),
                                  " ".join(game.get_action_meanings()), os.path.basename(str(game.ale.getString("rom_file")))])
        import ale_py

        result["ale_version"] = np.array(ale_py.__version__)
    else:
        result["screens"] = np.stack(screens)
    env.close()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=["appo", "sf"], required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--doom_scenarios_dir", default=None,
                        help="appo: load the Doom scenario files from this folder (Sample Factory's, for a map the "
                             "vizdoom package ships otherwise)")
    args = parser.parse_args()
    env = appo_env(args.env, args.doom_scenarios_dir) if args.trainer == "appo" else sample_factory_env(args.env)
    np.savez_compressed(args.out, **probe(env, args.steps, args.seed))


if __name__ == "__main__":
    main()
