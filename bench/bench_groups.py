"""Groups of agents, each trained by a policy of its own, and shown to have learnt: a mixed
multi-agent env (agents with different spaces) trained with no flag but --env, then its final
checkpoints played in four pairings.

    python bench/bench_groups.py --env pz:mpe2.simple_tag_v3:parallel_env --seeds 1 2 3 \
        --frames 500000 --results_dir docs/bench/groups/simple_tag
    python bench/bench_groups.py --results_dir docs/bench/groups/simple_tag --report_only

For each seed, appo.py trains at the env family's defaults until every policy has trained --frames
frames (a frame is one agent's step; a group with fewer agents reaches it later). Then appo.py
--mode eval plays --games games of each pairing with the final checkpoints (--seed the run's):

- random: every group plays uniform random actions (the floor);
- trained: every group plays its trained policy;
- one row per group g, "g trained": g's agents play their policy, every other group random.

A group has learnt when its agents score more trained against random opponents than random against
random ones: the pairing changes its own play and nothing else. The "trained" row shows where the
two trained sides meet. The table: each group's mean return an agent, median [min, max] over seeds.
One seed at a time; a saved seed is skipped (its file names the commit and command that made it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_learning as bench  # noqa: E402  (run_trainer, code hash, commit, machine, versions)

sys.path.insert(0, bench.REPO)
import env as envs  # noqa: E402

GROUP_LINE = re.compile(r"^group (\d+) \((.*); policy ([\w/]+)\): mean return (-?[\d.]+) an agent$", re.MULTILINE)


def env_groups(env_name: str) -> tuple[list[list[str]], list[int]]:
    """The env's groups (agents with the same spaces), as appo.py forms them: each group's agent
    names, and each group's first policy at the family's defaults (policy g plays group g)."""
    env = envs.create_env(env_name, None, env_index=0)
    try:
        names, agent_spaces = envs.get_agent_names(env), envs.get_agent_spaces(env)
    finally:
        env.close()
    distinct, of_agent = envs.space_groups(agent_spaces)
    members = [[name for name, group in zip(names, of_agent) if group == g] for g in range(len(distinct))]
    return members, list(range(len(distinct)))


def pairings(members: list[list[str]], policies: list[int]) -> dict[str, str | None]:
    """Pairing name -> --agent_policies (None: every group its trained policy)."""
    def mapping(trained: set[int]) -> str:
        return ",".join(f"{name}={policies[group] if group in trained else 'random'}"
                        for group, names in enumerate(members) for name in names)

    result = {"random": mapping(set()), "trained": None}
    for group in range(len(members)):
        result[f"{group} trained"] = mapping({group})
    return result


def evaluate(env_name: str, train_dir: str, seed: int, games: int, agent_policies: str | None) -> list[float]:
    """Each group's mean return an agent over `games` games of one pairing."""
    command = [sys.executable, os.path.join(bench.REPO, "appo.py"), "--mode", "eval", "--env", env_name,
               "--train_dir", train_dir, "--experiment", "run", "--max_num_episodes", str(games), "--seed", str(seed)]
    if agent_policies is not None:
        command += ["--agent_policies", agent_policies]
    played = subprocess.run(command, capture_output=True, text=True, cwd=train_dir, timeout=1800)
    found = GROUP_LINE.findall(played.stdout)
    if played.returncode != 0 or not found:
        raise RuntimeError(f"evaluation failed ({' '.join(command)}):\n{(played.stdout + played.stderr)[-2000:]}")
    return [float(mean) for _, _, _, mean in sorted(found, key=lambda line: int(line[0]))]


def run_seed(args, seed: int, path: str):
    members, policies = env_groups(args.env)
    code, commit = bench.appo_code_hash(), bench.git_commit()  # the code that trains, read before it starts
    train_dir = tempfile.mkdtemp(prefix="bench_groups_")
    command = [sys.executable, os.path.join(bench.REPO, "appo.py"), "--env", args.env, "--seed", str(seed),
               "--train_dir", train_dir, "--experiment", "run", "--train_for_env_steps", str(args.frames),
               "--report_every_sec", "10"]
    print(f"{time.strftime('%H:%M:%S')} {args.env} seed {seed}: training, every policy {args.frames:,} frames",
          flush=True)
    try:
        run = bench.run_trainer(command, train_dir, os.path.join(train_dir, "train_output.log"),
                                stall_seconds=600, max_seconds=6 * 3600)
        with open(os.path.join(train_dir, "train_output.log")) as f:
            log = f.read()
        if run["status"] != "ok":
            raise RuntimeError(f"training {run['status']}:\n{log[-3000:]}")
        trained = {int(policy): int(frames.replace(",", "")) for policy, frames
                   in re.findall(r"^done: policy (\d+): ([\d,]+) frames trained", log, re.MULTILINE)}
        scores = {name: evaluate(args.env, train_dir, seed, args.games, mapping)
                  for name, mapping in pairings(members, policies).items()}
        precision = bench.trainer_precision("appo", train_dir)
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)
    result = {"config": {"trainer": "appo", "env": args.env, "frames": args.frames, "seed": seed, "extra_flags": [],
                         "code": code},
              "commit": commit, "command": " ".join(command[1:]).replace(train_dir, "TRAIN_DIR"),
              "groups": members, "games": args.games, "frames_trained": trained, "scores": scores, "precision": precision,
              "machine": bench.machine(), "versions": bench.package_versions(sys.executable),
              **{key: run[key] for key in ("started_at", "wall_s", "other_cpu_share")},
              "log_tail": log[-3000:]}
    bench.save_json(path, result)
    print(f"{time.strftime('%H:%M:%S')} seed {seed}: " + "; ".join(
        f"{name}: " + " / ".join(f"{score:.2f}" for score in values) for name, values in scores.items()), flush=True)


def table(results: list[dict]) -> str:
    """Pairing x group: each group's mean return an agent, median [min, max] over the seeds."""
    members = results[0]["groups"]
    header = ["pairing", *(f"group {g}: {', '.join(names)}" for g, names in enumerate(members))]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pairing in results[0]["scores"]:
        cells = []
        for group in range(len(members)):
            values = sorted(result["scores"][pairing][group] for result in results)
            cells.append(f"{statistics.median(values):.2f} [{values[0]:.2f}, {values[-1]:.2f}]")
        lines.append(f"| {pairing} | " + " | ".join(cells) + " |")
    minutes = sorted(result["wall_s"] / 60 for result in results)
    frames = sorted(sum(result["frames_trained"].values()) for result in results)
    lines += ["", f"{len(results)} seeds ({', '.join(str(r['config']['seed']) for r in results)}), {results[0]['games']} "
                  f"games a pairing; training {statistics.median(minutes):.1f} min median, "
                  f"{statistics.median(frames):,.0f} frames trained by all policies (median); code "
                  f"{results[0]['config']['code']}"]
    shared = [f"seed {r['config']['seed']}: {r['other_cpu_share']:.0%}" for r in results
              if r["other_cpu_share"] > bench.CONTENDED_SHARE]
    if shared:
        lines.append("Shared the machine (CPU elsewhere): " + ", ".join(shared))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", help="a multi-agent env whose agents form groups (a pz: name)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=500_000, help="frames each policy trains")
    parser.add_argument("--games", type=int, default=200, help="games each pairing plays")
    parser.add_argument("--results_dir", required=True)
    parser.add_argument("--report_only", action="store_true", help="print the table of the saved seeds")
    args = parser.parse_args(argv)
    if not args.report_only:
        if not args.env:
            parser.error("--env: name the env to train (or pass --report_only)")
        for seed in args.seeds:
            path = os.path.join(args.results_dir, f"appo_seed{seed}.json")
            if os.path.exists(path):
                print(f"seed {seed}: saved in {path}; skipped", flush=True)
                continue
            run_seed(args, seed, path)
    results = [bench.load_result(path) for path in sorted(
        os.path.join(args.results_dir, name) for name in os.listdir(args.results_dir) if name.endswith(".json"))]
    results = [result for result in results if result]
    if results:
        print(table(results))


if __name__ == "__main__":
    main()
