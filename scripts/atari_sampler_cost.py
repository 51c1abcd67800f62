#!/usr/bin/env python
"""Does ale-py's C++ vector env step Atari for less CPU than our per-env wrapper stack? CPU seconds
per 1,000 frames of each way of stepping the same games with random actions, in this process, one
way after the other, repeated in turn (medians), with the emulator's own cost as the floor:

  ale       the emulator alone: ALEInterface.act 4 times, the grey screen of the last 2 frames,
            their max, an 84x84 INTER_AREA resize; no frame stack, wrappers or no-op starts (the
            floor that any sampler pays)
  ours      env.create_env's Atari stack, as a rollout worker steps it (gym.make's env under
            no-op starts, max-and-skip, episodic life, FIRE, resize, frame stack, reward sign)
  vector1   ale_py.vector_env.AtariVectorEnv with the same preprocessing, num_threads 1
  vector2   the same with num_threads 2 (the threads' CPU counts too)

A rollout worker on a many-core machine costs what its env stack costs plus its own Python, so
a vector env is worth its own path only if its row is below ours (docs/results/throughput.md).

    python scripts/atari_sampler_cost.py --game breakout --repeats 3 --out docs/bench/cpu/atari_sampler_COMMIT.json
    python scripts/atari_sampler_cost.py --report docs/bench/cpu/atari_sampler_COMMIT.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
import bench_throughput as bench  # noqa: E402

appo, envs = bench.appo, bench.envs
LEGS = ["ale", "ours", "vector1", "vector2"]
FRAMESKIP = 4


def cpu_seconds() -> float:
    """This process's user+system CPU time, all its threads included."""
    times = os.times()
    return times.user + times.system


def run_ale(game: str, num_envs: int, seconds: float) -> tuple[int, float]:
    import cv2
    from ale_py import ALEInterface, LoggerMode, roms
    ALEInterface.setLoggerMode(LoggerMode.Error)
    ales = []
    for seed in range(num_envs):
        ale = ALEInterface()
        ale.setInt("random_seed", seed)
        ale.setFloat("repeat_action_probability", 0.0)
        ale.loadROM(roms.get_rom_path(game))
        ales.append(ale)
    actions, rng = ales[0].getMinimalActionSet(), np.random.default_rng(0)
    screens = np.empty((2, 210, 160), np.uint8)
    frames, start_cpu, deadline = 0, cpu_seconds(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        for ale in ales:
            action = actions[rng.integers(len(actions))]
            for frame in range(FRAMESKIP):
                ale.act(action)
                if frame >= FRAMESKIP - 2:
                    ale.getScreenGrayscale(screens[frame - FRAMESKIP + 2])
            cv2.resize(screens.max(axis=0), (84, 84), interpolation=cv2.INTER_AREA)
            if ale.game_over():
                ale.reset_game()
            frames += FRAMESKIP
    return frames, cpu_seconds() - start_cpu


def run_ours(game: str, num_envs: int, seconds: float) -> tuple[int, float]:
    name = f"atari_{game}"
    cfg = appo.parse_args(["--env", name])
    made = [envs.create_env(name, cfg, env_index=i) for i in range(num_envs)]
    try:
        for env in made:
            env.reset(seed=num_envs)
        frames, start_cpu, deadline = 0, cpu_seconds(), time.monotonic() + seconds
        while time.monotonic() < deadline:
            for env in made:
                bench.step_randomly(env, 1)
                frames += FRAMESKIP
        return frames, cpu_seconds() - start_cpu
    finally:
        for env in made:
            env.close()


def run_vector(game: str, num_envs: int, seconds: float, threads: int) -> tuple[int, float]:
    from ale_py.vector_env import AtariVectorEnv
    vector = AtariVectorEnv(game, num_envs, num_threads=threads, frameskip=FRAMESKIP, noop_max=30,
                            episodic_life=True, use_fire_reset=True, reward_clipping=True, stack_num=4,
                            img_height=84, img_width=84, grayscale=True, repeat_action_probability=0.0)
    try:
        vector.reset(seed=num_envs)
        rng, num_actions = np.random.default_rng(0), vector.single_action_space.n
        frames, start_cpu, deadline = 0, cpu_seconds(), time.monotonic() + seconds
        while time.monotonic() < deadline:
            vector.step(rng.integers(0, num_actions, num_envs))  # each env resets itself when done
            frames += FRAMESKIP * num_envs
        return frames, cpu_seconds() - start_cpu
    finally:
        vector.close()


def measure(leg: str, args) -> float:
    """CPU seconds per 1,000 frames of one leg's span."""
    if leg == "ale":
        frames, cpu = run_ale(args.game, args.num_envs, args.seconds)
    elif leg == "ours":
        frames, cpu = run_ours(args.game, args.num_envs, args.seconds)
    else:
        frames, cpu = run_vector(args.game, args.num_envs, args.seconds, threads=int(leg[len("vector"):]))
    return 1000.0 * cpu / frames


def format_table(result: dict) -> str:
    lines = [f"CPU seconds per 1,000 frames, {result['game']}, {result['num_envs']} envs in one process, "
             f"random actions, median of {result['repeats']}", "",
             "| sampler | CPU s / 1,000 frames | runs | / ours |", "|---|---|---|---|"]
    ours = statistics.median(result["runs"]["ours"]) if "ours" in result["runs"] else None
    for leg, runs in result["runs"].items():
        median = statistics.median(runs)
        ratio = f"{median / ours:.2f}" if ours else "-"
        lines.append(f"| {leg} | {median:.4f} | {', '.join(f'{run:.4f}' for run in runs)} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    if "--report" in sys.argv:
        with open(sys.argv[sys.argv.index("--report") + 1]) as f:
            saved = json.load(f)
        print("\n".join(f"# {key}: {value}" for key, value in saved["provenance"].items()))
        print(format_table(saved))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="breakout", help="an ALE rom id")
    parser.add_argument("--num_envs", type=int, default=8, help="games stepped in turn (a rollout worker's envs)")
    parser.add_argument("--seconds", type=float, default=15.0, help="the span of each leg")
    parser.add_argument("--repeats", type=int, default=3, help="each leg this many times, in turn")
    parser.add_argument("--legs", default=",".join(LEGS))
    parser.add_argument("--out", default=None, help="a result file (JSON) with the command and commit")
    parser.add_argument("--report", default=None, help="run nothing: the table of a result file")
    args = parser.parse_args()
    legs = args.legs.split(",")
    unknown = sorted(set(legs) - set(LEGS))
    if unknown:
        parser.error(f"--legs: unknown {unknown}; choose from {','.join(LEGS)}")
    result = {"game": args.game, "num_envs": args.num_envs, "repeats": args.repeats, "runs": {leg: [] for leg in legs}}
    for _ in range(args.repeats):
        for leg in legs:
            result["runs"][leg].append(measure(leg, args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "provenance": bench.provenance(args)}, f, indent=1)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
