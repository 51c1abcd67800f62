"""CPU seconds per 1,000 env frames, role by role, for appo.py and Sample Factory on the same
configuration, next to pure simulation: where a many-core machine's cores would go.

    python bench/cpu_accounting.py --env doom_basic --sf_python .venv-sf/bin/python
    python bench/cpu_accounting.py --report docs/bench/cpu/doom_basic_COMMIT.json --cores 16,36

On a GPU box the learner and the policy workers run on the GPU and the cores do one thing: step
envs and move their data, so frames per second = cores / (CPU seconds per frame on the rollout
side). This measures that side as it is: during a steady span of training (after --warmup seconds
from the first trained frames), each process's user+system CPU time from /proc/<pid>/stat, all its
threads included, summed by role, divided by the env frames collected in the span:

- env: the game's own processes (VizDoom's `vizdoom`); ALE and Gymnasium envs step inside the
  rollout workers, so for them this row is empty and the rollout row holds the emulator too;
- rollout workers: the processes that step the envs, without the game processes;
- policy workers (Sample Factory's inference workers), learner, runner (the launching process),
  other (resource trackers and the like).

Roles are read from process names: appo.py names its children (`appo-rollout`, ...); Sample
Factory's are named here, by a sitecustomize module put on its PYTHONPATH that gives each
multiprocessing child its Process name (`rollout_proc0`, `inference_proc0-0`, `learner_proc0`)
as its kernel name; nothing else of Sample Factory changes.

Pure simulation: the same envs created in this process and stepped with random actions, one after
the other, for --seconds: the game processes' CPU and this process's (the Python side of a step);
on one core with its games where the trainer pins its rollout workers (the Doom family).

--report also projects each leg to machines of --cores cores with a GPU: (cores - --gpu_side_cores)
/ the rollout side's CPU per frame (env + rollout workers; pure simulation gets every core). It
is an upper bound for cores like these: the GPU side can bind first, as on the one GPU run so far.
"""
import argparse
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import bench_throughput as bench  # noqa: E402

appo, envs, REPO = bench.appo, bench.envs, bench.REPO
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ["env", "rollout workers", "policy workers", "learner", "runner", "other"]
OUR_ROLES = {"appo-rollout": "rollout workers", "appo-policy": "policy workers", "appo-learner": "learner"}
SF_ROLES = {"rollout_proc": "rollout workers", "inference_proc": "policy workers", "learner_proc": "learner"}
GAME_PROCESSES = {"vizdoom"}
OURS_FRAMES = re.compile(r"\] frames ([\d,]+)")  # the status line's frames collected
# Gives each multiprocessing child of Sample Factory its Process name as its kernel name (comm), so
# that /proc tells its roles apart; runs in every interpreter started with this on PYTHONPATH.
NAMING_SITECUSTOMIZE = '''
import ctypes, multiprocessing.process as process
_bootstrap = process.BaseProcess._bootstrap
def _named_bootstrap(self, *args, **kwargs):
    try:
        ctypes.CDLL("libc.so.6").prctl(15, self.name.encode()[:15])  # PR_SET_NAME
    except OSError:
        pass
    return _bootstrap(self, *args, **kwargs)
process.BaseProcess._bootstrap = _named_bootstrap
'''


def processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, name, CPU seconds so far) for every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue  # exited meanwhile
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            found[int(entry)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


def cpu_by_role(root: int, names: dict[str, str]) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds) for `root` and all its descendants."""
    table = processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid not in table:
            continue
        _, name, cpu = table[pid]
        role = next((role for prefix, role in names.items() if name.startswith(prefix)), None)
        if pid == root:
            role = "runner"
        elif name in GAME_PROCESSES:
            role = "env"
        found[pid] = (role or "other", cpu)
        stack += children.get(pid, [])
    return found


def span_costs(samples: list[tuple[float, int, dict]], warmup: float, seconds: float) -> dict:
    """From (time, frames collected, cpu_by_role) samples taken at status lines: CPU seconds per
    1,000 frames of each role over the span that starts `warmup` s after the first sample with
    frames and lasts at least `seconds`."""
    started = [sample for sample in samples if sample[1] > 0]
    if not started:
        return {"error": "no status line with frames"}
    first = next((s for s in started if s[0] >= started[0][0] + warmup), None)
    # the last sample at which every process of the first still ran: a trainer's final status line
    # comes after its children stopped
    last = next((s for s in reversed(started) if first and s[0] >= first[0] + seconds and set(first[2]) <= set(s[2])),
                None)
    if first is None or last is None:
        return {"error": f"no span of {seconds:g} s after a warm-up of {warmup:g} s"}
    (t0, frames0, cpu0), (t1, frames1, cpu1) = first, last
    frames = frames1 - frames0
    per_role = dict.fromkeys(ROLES, 0.0)
    for pid, (role, cpu) in cpu1.items():
        per_role[role] += cpu - cpu0.get(pid, (role, 0.0))[1]  # a process born in the span counts from 0
    return {"seconds": round(t1 - t0, 1), "frames": frames, "fps": round(frames / (t1 - t0)),
            "cpu_per_1000_frames": {role: round(1000 * cpu / frames, 4) for role, cpu in per_role.items()},
            "cores_busy": round(sum(per_role.values()) / (t1 - t0), 2)}


def measure_trainer(command: list[str], names: dict[str, str], frames_of, warmup: float, seconds: float,
                    env: dict | None = None, cwd: str = REPO) -> dict:
    samples = []

    def sample(process, line: str):
        frames = frames_of(line)
        if frames:
            samples.append((time.monotonic(), frames, cpu_by_role(process.pid, names)))

    bench.run_logged_until(command, warmup + seconds + 12, started=frames_of, cwd=cwd, env=env, on_line=sample)
    return span_costs(samples, warmup, seconds)


def ours_frames(line: str) -> int:
    match = OURS_FRAMES.search(line) if line.startswith("[") else None
    return int(match.group(1).replace(",", "")) if match else 0


def sf_frames(line: str) -> int:
    match = bench.SF_TOTAL.search(line)
    return int(match.group(1)) if match else 0


def measure_ours(args) -> dict:
    with tempfile.TemporaryDirectory() as train_dir:
        command = bench.ours_command(args, bench.trainer_config(args, args.num_envs_per_worker), train_dir, 5.0)
        return measure_trainer(command, OUR_ROLES, ours_frames, args.warmup, args.seconds)


def measure_sample_factory(args) -> dict:
    with bench.semaphores_removed(), tempfile.TemporaryDirectory() as train_dir:
        with open(os.path.join(train_dir, "sitecustomize.py"), "w") as f:
            f.write(NAMING_SITECUSTOMIZE)
        command = bench.sample_factory_command(args, bench.trainer_config(args, args.num_envs_per_worker), train_dir)
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join([train_dir, os.environ.get("PYTHONPATH", "")]))
        return measure_trainer(command, SF_ROLES, sf_frames, args.warmup, args.seconds, env=environment, cwd=train_dir)


def measure_pure_simulation(args) -> dict:
    """The envs stepped with random actions in this process, one after the other."""
    cfg = appo.parse_args(bench.trainer_config(args, args.num_envs_per_worker) + args.trainer_flags)
    cores = os.sched_getaffinity(0)
    if cfg.set_workers_cpu_affinity:  # on one core with its games, as the trainer pins a rollout worker
        os.sched_setaffinity(0, {min(cores)})
    made = []
    try:
        for i in range(args.num_workers * args.num_envs_per_worker):
            made.append(envs.create_env(args.env, cfg, env_index=i))
        for env in made:
            env.reset(seed=len(made))
        frames, me = 0, os.getpid()
        cpu0, start = cpu_by_role(me, {}), time.monotonic()
        while time.monotonic() < start + args.seconds:
            for env in made:
                bench.step_randomly(env, envs.get_num_agents(env))
                frames += envs.get_num_agents(env) * cfg.env_frameskip
        cpu1, elapsed = cpu_by_role(me, {}), time.monotonic() - start
    finally:
        for env in made:
            env.close()
        os.sched_setaffinity(0, cores)  # the trainers' legs after this one get every core
    costs = span_costs([(0.0, 1, cpu0), (elapsed, 1 + frames, cpu1)], 0.0, 0.0)
    costs["cpu_per_1000_frames"]["rollout workers"] = costs["cpu_per_1000_frames"].pop("runner")  # this process steps
    return costs


def format_table(result: dict) -> str:
    legs = [leg for leg in ("pure", "ours", "sf") if "cpu_per_1000_frames" in result.get(leg, {})]
    titles = {"pure": "pure simulation", "ours": "appo.py", "sf": "Sample Factory"}
    lines = [f"CPU seconds per 1,000 env frames collected, {result['env']}, {result['configuration']}",
             "", "| role | " + " | ".join(titles[leg] for leg in legs) + (" | appo.py / SF |" if "sf" in legs else " |"),
             "|---" * (len(legs) + 1 + ("sf" in legs)) + "|"]
    for role in ROLES + ["total"]:
        values = [sum(result[leg]["cpu_per_1000_frames"].values()) if role == "total"
                  else result[leg]["cpu_per_1000_frames"].get(role, 0.0) for leg in legs]
        ratio = ""
        if "sf" in legs and "ours" in legs:
            ours, sf = values[legs.index("ours")], values[legs.index("sf")]
            ratio = f" {ours / sf:.2f} |" if sf else " - |"
        lines.append(f"| {role} | " + " | ".join(f"{v:.3f}" for v in values) + (" |" + ratio if ratio else " |"))
    lines.append("| frames/s | " + " | ".join(f"{result[leg]['fps']:,}" for leg in legs) + (" | |" if "sf" in legs else " |"))
    lines.append("| cores busy | " + " | ".join(f"{result[leg]['cores_busy']}" for leg in legs) + (" | |" if "sf" in legs else " |"))
    errors = [f"{leg}: {result[leg]['error']}" for leg in ("pure", "ours", "sf") if "error" in result.get(leg, {})]
    return "\n".join(lines + errors)


ROLLOUT_SIDE = ("env", "rollout workers")


def rollout_side(leg: dict) -> float:
    """CPU seconds per 1,000 frames that stepping the envs costs: the games and the rollout workers."""
    return sum(leg["cpu_per_1000_frames"].get(role, 0.0) for role in ROLLOUT_SIDE)


def projection(result: dict, machines: list[int], gpu_side_cores: float) -> str:
    """Frames per second of a machine with C cores and a GPU, where the learner and the policy workers
    compute on the GPU and every core left is stepping envs: (C - gpu_side_cores) / the rollout side's
    CPU per frame (pure simulation gets all C). gpu_side_cores is what the GPU-side processes still
    take of the cores (their Python, queues and copies), which a CPU-only run cannot tell. An upper
    bound: the GPU side can bind first (docs/gpu.md), and cores of another machine cost otherwise."""
    legs = [leg for leg in ("pure", "ours", "sf") if "cpu_per_1000_frames" in result.get(leg, {})]
    titles = {"pure": "pure simulation", "ours": "appo.py", "sf": "Sample Factory"}
    lines = [f"Projected frames/s with a GPU, {result['env']}: (cores - {gpu_side_cores:g}) / rollout-side CPU per frame "
             "(pure simulation: cores / its CPU per frame)", "",
             "| cores | " + " | ".join(titles[leg] for leg in legs) + " |", "|---" * (len(legs) + 1) + "|",
             "| rollout side, CPU s / 1,000 frames | " + " | ".join(f"{rollout_side(result[leg]):.3f}" for leg in legs) + " |"]
    for cores in machines:
        rates = [1000 * (cores if leg == "pure" else cores - gpu_side_cores) / rollout_side(result[leg]) for leg in legs]
        lines.append(f"| {cores} | " + " | ".join(f"{rate:,.0f}" for rate in rates) + " |")
    return "\n".join(lines)


def main() -> int:
    if "--report" in sys.argv:
        report = argparse.ArgumentParser(description="the table of a result file, and a projection")
        report.add_argument("--report", required=True, help="a result file of this script")
        report.add_argument("--cores", default="16,36", help="machines to project to, by their cores")
        report.add_argument("--gpu_side_cores", type=float, default=2.0,
                            help="cores the GPU-side processes take (one policy worker and one learner)")
        args = report.parse_args()
        with open(args.report) as f:
            saved = json.load(f)
        print("\n".join(f"# {key}: {value}" for key, value in saved["provenance"].items()))
        print(format_table(saved))
        print()
        print(projection(saved, [int(cores) for cores in args.cores.split(",")], args.gpu_side_cores))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--num_envs_per_worker", type=int, default=8)
    parser.add_argument("--worker_num_splits", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=512, help="one minibatch, both trainers")
    parser.add_argument("--rollout", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured span of each trainer")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds from the first frames to the span")
    parser.add_argument("--legs", default="pure,ours,sf")
    parser.add_argument("--sf_python", default=None, help="Sample Factory's interpreter; without it no sf leg")
    parser.add_argument("--out", default=None, help="a result file (JSON) with the command and commit")
    parser.add_argument("--report", default=None, help="run nothing: the table of a result file")
    parser.add_argument("trainer_flags", nargs="*", help="after --: more appo.py flags")
    args = parser.parse_args()
    error = envs.env_error(args.env)
    if error:
        raise SystemExit(f"error: --env: {error}")
    legs = [leg for leg in args.legs.split(",") if leg != "sf" or args.sf_python]
    result = {"env": args.env, "configuration": f"{args.num_workers} workers x {args.num_envs_per_worker} envs, "
              f"{args.worker_num_splits} splits, rollout {args.rollout}, batch {args.batch_size}"}
    measure = {"pure": measure_pure_simulation, "ours": measure_ours, "sf": measure_sample_factory}
    for leg in legs:
        print(f"# {leg}", flush=True)
        result[leg] = measure[leg](args)
    result["provenance"] = bench.provenance(args)  # the CPU and whether it computes bfloat16 among it
    precision = bench.leg_precision(args, bench.trainer_config(args, args.num_envs_per_worker))
    result["precision"] = {leg: precision[leg] for leg in legs if leg in precision}  # what each trainer ran
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
