"""Random play's score on any env appo.py trains: the floor a learning curve is read against.

    python scripts/tools/random_play.py gym:Acrobot-v1 --episodes 300
    python scripts/tools/random_play.py pz:mpe2.simple_spread_v3:parallel_env --json docs/bench/pettingzoo/random.json

Each agent takes uniformly random actions (among the allowed ones where the observation carries an
`action_mask`) in envs made by env.py's create_env with the env family's defaults, so the score is
the one appo.py reports: the true_return of each finished game, per agent, averaged over
--episodes games (seeded: env i is reset with seed --seed + i, actions drawn from --seed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import env as envs  # noqa: E402
from appo import random_action  # noqa: E402


def play(env_name: str, episodes: int, seed: int, obs_keys: list[str] | None = None) -> tuple[list[float], list[int]]:
    """The true_return of `episodes` finished games (each agent's game counts once), and the
    group of the agent each return is of (appo.py's groups: agents with the same spaces)."""
    env = envs.create_env(env_name, types.SimpleNamespace(obs_keys=obs_keys) if obs_keys else None, env_index=0)
    agent_spaces = envs.get_agent_spaces(env)
    groups = envs.space_groups(agent_spaces)[1]
    action_spaces = [env.action_space] * len(agent_spaces)
    if len(set(groups)) > 1:  # agents of different groups: each its own space, seeded apart
        action_spaces = [action_space for _, action_space in agent_spaces]
        for agent, action_space in enumerate(action_spaces[1:], 1):
            action_space.seed(seed + agent)
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    num_agents = envs.get_num_agents(env)
    returns: list[float] = []
    of_group: list[int] = []
    resets = 0
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        if num_agents == 1:
            obs, _, terminated, truncated, info = env.step(random_action(env.action_space, obs, rng))
            infos, done = [info], terminated or truncated
        else:
            actions = [random_action(space, agent_obs, rng) for space, agent_obs in zip(action_spaces, obs)]
            obs, _, terminated, truncated, infos = env.step(actions)
            done = all(t or u for t, u in zip(terminated, truncated))
        returns += [info["true_return"] for info in infos if "true_return" in info]
        of_group += [groups[agent] for agent, info in enumerate(infos) if "true_return" in info]
        if done:
            resets += 1
            obs, _ = env.reset(seed=seed + resets)
    env.close()
    return returns[:episodes], of_group[:episodes]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env", help="any name appo.py's --env takes")
    parser.add_argument("--episodes", type=int, default=300, help="finished games to average")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--obs_keys", nargs="+", default=None, help="as appo.py's: the Dict keys the env keeps")
    args = parser.parse_args(argv)
    problem = envs.env_error(args.env)
    if problem:
        parser.error(f"env: {problem}")
    started = time.time()
    returns, of_group = play(args.env, args.episodes, args.seed, args.obs_keys)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    result = {"env": args.env, "episodes": len(returns), "seed": args.seed, "commit": commit or "unknown",
              "mean_return": statistics.fmean(returns), "stdev_return": statistics.pstdev(returns),
              "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "date": time.strftime("%Y-%m-%d", time.gmtime(started)), "seconds": round(time.time() - started, 1)}
    if len(set(of_group)) > 1:  # each group's agents' mean: predators and prey score apart
        result["group_mean_returns"] = [statistics.fmean(r for r, g in zip(returns, of_group) if g == group)
                                        for group in sorted(set(of_group))]
    print(f"{args.env}: random play, {result['episodes']} games: {result['mean_return']:.2f} "
          f"(stdev {result['stdev_return']:.2f})"
          + "".join(f"; group {group} {mean:.2f}" for group, mean in enumerate(result.get("group_mean_returns", []))))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
