#!/usr/bin/env python
"""Time per sample of the policy worker's batch path (PolicyWorker.act_on) on doom_basic's model,
split into the forward pass (appo.act) and everything around it: the staleness checks, the
gather of observations and RNN states, the copies and the scatter of the outputs. On the CPU
it is this thread's CPU time; with --device cuda the wall clock (every result says which).

    python bench/bench_policy_worker.py                          # this tree, one table
    python bench/bench_policy_worker.py --tree /tmp/before       # another checkout's appo.py
    python bench/bench_policy_worker.py --compare /tmp/before . --rounds 3 --out result.json

A real PolicyWorker on real shared slots, without an env: the slots hold random frames, and
each iteration asks for the actions of every (worker, split) as the rollout workers do, through
a real appo_ipc.Queue. `act` is wrapped with the same clock, so the forward's share is measured
in the same call as the rest (no second, differently noisy call). On the CPU, CPU time of this
thread (time.thread_time, torch on one thread as in a policy worker) counts what the path costs,
not what other processes on the machine take from it. On a GPU that time would count waiting
too: a wait on a CUDA event or a host read spins this thread's core, so the wall clock is the
honest figure there (it includes the GPU's own time for the forward pass).

The request format is found at run time (appo.action_request exists from the batch path on), so
the same file measures a commit before and after. --compare runs the trees in turn, round after
round, each in a fresh process, and prints the medians over the rounds.
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS_PER_SPLIT = 4  # 8 envs per worker in 2 splits, as on a 16-core machine's Doom defaults
BATCHES = [8, 32, 128]
MIN_ITERATIONS = 20


def load_appo(tree: str):
    sys.path.insert(0, tree)  # ahead of any installed appo (an editable install points elsewhere)
    import appo
    if os.path.dirname(os.path.abspath(appo.__file__)) != os.path.abspath(tree):
        raise SystemExit(f"imported {appo.__file__}, not the one in {tree}")
    return appo


def requests_of_split(appo, worker: int, split: int, generation: int, actors) -> list[tuple]:
    """What RolloutWorker.request_actions puts in the queue for one split of one policy."""
    if hasattr(appo, "action_request"):
        return [appo.action_request(worker, split, generation, actors)]
    return [(worker, split, generation, actor.slot, actor.step) for actor in actors]


def clock_of(device: str):
    """The clock a device's figures are read from, and its name (the module docstring says why)."""
    return (time.perf_counter, "wall clock") if device.startswith("cuda") else (time.thread_time, "thread CPU time")


class Forwards:
    """appo.act with `clock` around it: act_on looks it up in the module at every call."""

    def __init__(self, appo, clock):
        self.act, self.clock, self.seconds = appo.act, clock, 0.0
        appo.act = self

    def __call__(self, *args):
        start = self.clock()
        try:
            return self.act(*args)
        finally:
            self.seconds += self.clock() - start


def measure(appo, batch: int, seconds: float, device: str, train_dir: str) -> dict:
    import numpy as np
    import torch
    from gymnasium import spaces

    num_workers = batch // (2 * ENVS_PER_SPLIT)
    cfg = appo.parse_args(["--env", "doom_basic", "--num_workers", str(num_workers), "--num_envs_per_worker",
                           str(2 * ENVS_PER_SPLIT), "--worker_num_splits", "2", "--train_dir", train_dir,
                           "--experiment", f"bench_{batch}", "--seed", "1", "--device", device])
    torch.set_num_threads(cfg.policy_worker_threads)  # as child_process_setup does in a policy worker
    torch.manual_seed(1)
    doom_basic = (spaces.Box(0, 255, (3, 72, 128), np.uint8), spaces.Discrete(4))
    probe = appo.EnvProbe(doom_basic, num_agents=1, reward_shaping=None)
    shared = appo.create_shared(cfg, appo.make_model(*doom_basic, cfg), probe)
    slots = shared.slots
    rng = np.random.default_rng(0)
    slots.arrays["obs"][:] = rng.integers(0, 256, slots.arrays["obs"].shape, dtype=np.uint8)
    slots.arrays["rnn_state"][:] = rng.standard_normal(slots.arrays["rnn_state"].shape, dtype=np.float32)
    splits = []
    for worker in range(num_workers):
        for split in range(2):
            envs = range(split * ENVS_PER_SPLIT, (split + 1) * ENVS_PER_SPLIT)
            actors = [appo.Actor(env_id, 0, 0) for env_id in envs]
            for actor in actors:
                actor.slot, actor.step = slots.control.acquire(worker), int(rng.integers(0, cfg.rollout))
            splits.append((worker, split, actors))
    policy_worker = appo.PolicyWorker(0, cfg, shared, doom_basic)
    policy_worker.load_latest_weights()
    clock, clock_name = clock_of(device)
    forwards = Forwards(appo, clock)
    rows, spent = [], 0.0
    for iteration in itertools.count():
        if iteration >= 3 + MIN_ITERATIONS and spent >= seconds:
            break
        messages = []
        for worker, split, actors in splits:
            generation = slots.control.set_pending(worker, split, len(actors))
            messages += requests_of_split(appo, worker, split, generation, actors)
        start = clock()
        shared.request_queues[0].put_many(messages)
        taken = shared.request_queues[0].get_many()
        queued = clock()
        forwards.seconds = 0.0
        policy_worker.act_on(taken)
        acted = clock()
        if any(slots.control.pending(worker, split) != 0 for worker, split, _ in splits):
            raise SystemExit("act_on left requests unanswered: the benchmark is not what the trainer does")
        if iteration >= 3:  # 3 to warm up
            rows.append((queued - start, acted - queued, forwards.seconds))
            spent += acted - start
    appo.act = forwards.act
    for q in shared.request_queues + shared.learner_queues + [shared.stats_queue]:
        q.close()
    per_sample = lambda values: 1e6 * statistics.median(values) / batch
    return {"batch": batch, "iterations": len(rows), "clock": clock_name,
            "queue_us": per_sample([r[0] for r in rows]),
            "act_on_us": per_sample([r[1] for r in rows]),
            "forward_us": per_sample([r[2] for r in rows]),
            "outside_us": per_sample([r[1] - r[2] for r in rows])}


def commit_of(tree: str) -> str:
    head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def record_of(tree: str, appo, device: str) -> dict:
    """What a run's figures need beside them: the tree and its commit, the device and its clock, the
    CPU (bench_learning's machine(): its model, cores and native bfloat16), torch's version, and the
    precision the policy worker's encoder computes in (the tree's --encoder_dtype, `auto` resolved
    on this device as a policy worker resolves it)."""
    import torch

    path = list(sys.path)
    try:
        import bench_learning  # beside this file; it puts this repository first on sys.path, undone below
    finally:
        sys.path[:] = path  # so that a --tree's own modules keep coming from that tree
    cfg = appo.parse_args(["--env", "doom_basic", "--device", device])
    return {"tree": os.path.abspath(tree), "commit": commit_of(tree), "appo": appo.__file__, "device": device,
            "clock": clock_of(device)[1], "machine": bench_learning.machine(), "torch": torch.__version__,
            "precision": f"{cfg.encoder_dtype} encoder"}


def run_tree(tree: str, batches: list[int], seconds: float, device: str) -> dict:
    appo = load_appo(tree)
    record = record_of(tree, appo, device)  # first: a tree it cannot read fails before the timing, not after
    results = []
    with tempfile.TemporaryDirectory() as train_dir:
        for batch in batches:
            results.append(measure(appo, batch, seconds, device, train_dir))
    return {**record, "results": results}


def table(runs_by_tree: dict[str, list[dict]]) -> str:
    """Medians over the rounds of each tree, per batch size; with two trees, the ratio of the first
    tree's time outside the forward to the second's."""
    trees = list(runs_by_tree)
    columns = ["queue_us", "act_on_us", "forward_us", "outside_us"]
    clocks = sorted({runs[0]["clock"] for runs in runs_by_tree.values()})
    lines = [f"µs per sample by the {' and '.join(clocks)}", "",
             "| tree | commit | batch | queue put+take µs/sample | act_on µs/sample | forward µs/sample | "
             "outside the forward µs/sample | rounds |", "|---|---|---|---|---|---|---|---|"]
    medians = {}
    for tree, runs in runs_by_tree.items():
        for index, batch_result in enumerate(runs[0]["results"]):
            batch = batch_result["batch"]
            values = {c: statistics.median(run["results"][index][c] for run in runs) for c in columns}
            medians[(tree, batch)] = values
            lines.append(f"| {tree} | {runs[0]['commit']} | {batch} | " +
                         " | ".join(f"{values[c]:.1f}" for c in columns) + f" | {len(runs)} |")
    if len(trees) == 2:
        lines.append("")
        for batch in sorted({b for _, b in medians}):
            before, after = medians[(trees[0], batch)], medians[(trees[1], batch)]
            lines.append(f"batch {batch}: outside the forward {before['outside_us']:.1f} -> {after['outside_us']:.1f} "
                         f"µs/sample ({before['outside_us'] / after['outside_us']:.2f}x less); queue "
                         f"{before['queue_us']:.1f} -> {after['queue_us']:.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=HERE, help="the checkout whose appo.py and appo_ipc to measure")
    parser.add_argument("--compare", nargs="+", metavar="TREE", help="measure these checkouts in turn, in rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES,
                        help=f"multiples of {2 * ENVS_PER_SPLIT} (whole workers of two splits)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help=f"seconds of act_on a batch size, by the device's clock (at least {MIN_ITERATIONS} "
                             "batches)")
    parser.add_argument("--device", default="cpu",
                        help="the policy worker's; cuda: times by the wall clock, not this thread's CPU time")
    parser.add_argument("--json", action="store_true", help="one run's results as JSON (what --compare reads)")
    parser.add_argument("--out", help="with --compare: write every run and the table here (JSON)")
    args = parser.parse_args()
    if any(batch % (2 * ENVS_PER_SPLIT) for batch in args.batches):
        parser.error(f"--batches must be multiples of {2 * ENVS_PER_SPLIT}")
    if not args.compare:
        run = run_tree(args.tree, args.batches, args.seconds, args.device)
        print(json.dumps(run) if args.json else table({args.tree: [run]}))
        return 0
    runs_by_tree = {tree: [] for tree in args.compare}
    for round_ in range(args.rounds):
        for tree in args.compare:  # in turn, so a change in the machine's load falls on every tree
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--tree", tree, "--json", "--seconds",
                                  str(args.seconds), "--device", args.device, "--batches", *map(str, args.batches)],
                                 capture_output=True, text=True, check=True)
            runs_by_tree[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}/{args.rounds}: {tree} done", file=sys.stderr, flush=True)
    result = table(runs_by_tree)
    print(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                       "load_average_at_end": os.getloadavg(), "table": result, "runs": runs_by_tree}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
