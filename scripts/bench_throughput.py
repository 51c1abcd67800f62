#!/usr/bin/env python
"""Training throughput next to what bounds it, all measured in one run on this machine.

For one env and one configuration (workers, envs per worker, splits, batch, rollout) it measures:

  pure sim   the same number of processes stepping the same envs with random actions and no
             model: the most frames per second the envs can give here
  ceiling    an upper bound: the cost per sample of an env step, a forward pass at the policy
             worker's precision and largest batch (every actor at once), and the learner's
             forward+backward, each timed on one core, combined into the FPS that all the cores
             could deliver if no process ever waited (with `-- --device cuda` the model's share
             is timed on the GPU, and the ceiling is the lower of the cores' and the GPU's rates)
  ours       appo.py's steady training FPS with its defaults (a bfloat16 encoder where the
             hardware has it), with how busy each kind of process was and the policy lag
  ours_fp32  the same with --encoder_dtype float32: Sample Factory's precision
  sf         Sample Factory 2.1.1 with the same configuration and the same SGD work per batch
             (epochs, minibatches), asynchronous like ours, from its own log (needs --sf_python;
             scripts/setup_sample_factory.sh makes that interpreter)

Both trainers are measured alike: FPS is env frames *trained* per second (frameskip included;
what Sample Factory's "Fps is" line counts), the frames trained between the first report after
--warmup seconds (counted from the trainer's first report of trained frames) and the last report
before it is stopped, over the seconds between them; neither writes
checkpoints during the run. The table gives ours/pure sim, ours/ceiling, ours/SF and
ours_fp32/SF (like for like). `--json` prints
the same figures as JSON; `--sweep 2,4,8` repeats everything for several envs per worker and
`--plot` draws FPS against the number of envs (the paper's Figure 3). Every leg runs for
`--seconds` (after `--warmup` for the trainers); `--repeats N` runs each leg N times and reports
medians. Nothing is left running or in /dev/shm afterwards.

  python scripts/bench_throughput.py --env doom_basic
  python scripts/bench_throughput.py --env atari_breakout --sf_python .venv-sf/bin/python --repeats 3
  python scripts/bench_throughput.py --sweep 2,4,8,16 --legs pure,ours --plot docs/fps_vs_envs.png
  python scripts/bench_throughput.py --report A.json B.json   # configurations side by side, from --out files
"""
import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import appo  # noqa: E402
import env as envs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGS = ["pure", "ceiling", "ours", "ours_fp32", "sf"]
NO_CHECKPOINTS = ["--save_every_sec", "100000"]  # both trainers: no checkpoint during a measurement


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default="doom_basic", help="env name, as for appo.py")
    parser.add_argument("--num_workers", type=int, default=2, help="rollout worker processes")
    parser.add_argument("--num_envs_per_worker", type=int, default=8, help="envs per rollout worker")
    parser.add_argument("--worker_num_splits", type=int, default=2, help="env groups per worker")
    parser.add_argument("--batch_size", type=int, default=512, help="samples per SGD step (one minibatch)")
    parser.add_argument("--rollout", type=int, default=32, help="env steps per trajectory")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds of each leg")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of training before the trainers' FPS counts")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each leg; the table shows medians")
    parser.add_argument("--report_every", type=float, default=10.0,
                        help="appo.py's status interval, the grain of its measurement (Sample Factory reports "
                             "every 10 s); shorter only to make a short leg finish sooner")
    parser.add_argument("--legs", default="pure,ceiling,ours,ours_fp32,sf",
                        help="comma-separated legs to run, from: " + ",".join(LEGS))
    parser.add_argument("--sf_python", default=None,
                        help="interpreter of a Sample Factory 2.1.1 environment; without it the sf leg is skipped")
    parser.add_argument("--sweep", default=None,
                        help="comma-separated envs-per-worker values: one row per value")
    parser.add_argument("--plot", default=None, help="PNG of FPS against the number of envs (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--out", default=None,
                        help="also write a result file (JSON): the figures, the command, and the commit of the "
                             "code and bench that made them, with any uncommitted file named")
    parser.add_argument("--report", nargs="+", default=None,
                        help="run nothing: print the table of a result file from --out; of several, one row "
                             "each (its env, appo.py flags after --, and each leg's median and runs)")
    parser.add_argument("trainer_flags", nargs="*",
                        help="after --: more appo.py flags for our trainer (model flags apply to the ceiling too)")
    args = parser.parse_args()
    legs = args.legs.split(",")
    unknown = [leg for leg in legs if leg not in LEGS]
    if unknown:
        parser.error(f"--legs: unknown leg(s) {unknown}; choose from {LEGS}")
    if "sf" in legs and args.sf_python is None:
        legs.remove("sf")
    elif args.sf_python and not os.access(args.sf_python, os.X_OK):
        parser.error(f"--sf_python {args.sf_python} is not an executable; make one with "
                     "scripts/setup_sample_factory.sh")
    args.legs = legs
    if args.sf_python:  # its runs start in other folders
        args.sf_python = os.path.abspath(args.sf_python)
    args.envs_per_worker = [int(v) for v in args.sweep.split(",")] if args.sweep else [args.num_envs_per_worker]
    return args


def trainer_config(args, envs_per_worker: int) -> list[str]:
    """The flags both trainers get for one configuration."""
    return ["--env", args.env, "--num_workers", str(args.num_workers),
            "--num_envs_per_worker", str(envs_per_worker), "--worker_num_splits", str(args.worker_num_splits),
            "--batch_size", str(args.batch_size), "--rollout", str(args.rollout)]


# ---------------------------------------------------------------------------------------------
# Pure simulation: worker processes stepping envs with random actions
# ---------------------------------------------------------------------------------------------

def step_randomly(env, num_agents: int):
    """One step with random actions for every agent; a new episode when all are done."""
    actions = env.action_space.sample() if num_agents == 1 else [env.action_space.sample() for _ in range(num_agents)]
    _, _, terminated, truncated, _ = env.step(actions)
    if isinstance(terminated, (list, tuple)):  # a multi-agent env with a flag per agent
        done = all(t or u for t, u in zip(terminated, truncated))
    else:
        done = terminated or truncated
    if done:
        env.reset()


def pure_sim_worker(flags: list[str], worker_id: int, seconds: float, ready, go, results):
    appo.child_process_setup("pure-sim", owns_envs=True)
    parent = os.getppid()
    cfg = appo.parse_args(flags)
    if cfg.set_workers_cpu_affinity:  # where the trainer pins its rollout workers (the Doom family), alike
        appo.pin_rollout_worker(worker_id, cfg.num_workers)
    env_list = []
    try:
        for i in range(cfg.num_envs_per_worker):
            env_list.append(envs.create_env(cfg.env, cfg, env_index=worker_id * cfg.num_envs_per_worker + i))
        agents = [envs.get_num_agents(env) for env in env_list]
        for env in env_list:
            env.reset()
        ready.put(worker_id)
        while not go.wait(timeout=0.5):
            if not appo.parent_alive(parent):
                return
        agent_steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for env, num_agents in zip(env_list, agents):
                step_randomly(env, num_agents)
                agent_steps += num_agents  # frames of every agent, as the trainers count them
        results.put(agent_steps * cfg.env_frameskip / (time.perf_counter() - start))
    finally:
        for env in env_list:
            env.close()


def measure_pure_sim(flags: list[str], num_workers: int, seconds: float) -> float:
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Queue(), context.Event(), context.Queue()
    workers = [context.Process(target=pure_sim_worker, args=(flags, worker_id, seconds, ready, go, results))
               for worker_id in range(num_workers)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=300)
        go.set()  # every env made and reset: the clocks start together
        fps = sum(results.get(timeout=seconds + 120) for _ in workers)
        for worker in workers:
            worker.join(timeout=30)
        return fps
    finally:
        for worker in workers:  # after a clean finish a no-op; after an error or Ctrl-C the cleanup
            appo.kill_process_group(worker.pid)


# ---------------------------------------------------------------------------------------------
# Compute ceiling: one core's cost per sample of each stage
# ---------------------------------------------------------------------------------------------

def random_batch(model: appo.ActorCritic, spaces_pair, cfg) -> dict[str, torch.Tensor]:
    """A learner batch [T+1, B, ...] of random data with the shapes, dtypes and memory layout of
    the real one (time-first views of trajectory-major memory, as RolloutSlots.gather gives)."""
    specs = appo.rollout_buffer_specs(*spaces_pair, cfg)
    shape = (cfg.rollout + 1, appo.trajectories_per_batch(cfg))
    batch = {name: torch.zeros(shape[::-1] + field_shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype)
             .transpose(0, 1) for name, (field_shape, dtype) in specs.items()}
    for key in model.encoders:
        batch[key].copy_(torch.randint(0, 256, batch[key].shape))
    for head, size in enumerate(model.action_dist.head_sizes):  # the bench runs discrete envs
        batch["actions"][..., head] = torch.randint(0, size, shape)
    batch["log_prob"][:] = -1.0
    batch["done"][:] = (torch.rand(shape) < 0.01).float()
    batch["valid"][:] = 1.0
    return batch


def seconds_per_call(function, min_seconds: float, min_calls: int = 3, device: torch.device | None = None) -> float:
    """Wall-clock seconds per call of `function`; on a GPU each call's kernels are waited for."""
    def call():
        function()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    call()  # warm-up: first calls allocate (and on a GPU load kernels)
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls


def measure_env_step(flags: list[str], seconds: float) -> tuple[float, int]:
    """Seconds per env step on one core (the env's own processes included), and agents per env."""
    cfg = appo.parse_args(flags)
    env_list = [envs.create_env(cfg.env, cfg, env_index=i) for i in range(cfg.num_envs_per_worker)]
    try:
        num_agents = envs.get_num_agents(env_list[0])
        for env in env_list:
            env.reset()

        def step_all():
            for env in env_list:
                step_randomly(env, num_agents)

        return seconds_per_call(step_all, seconds) / len(env_list), num_agents
    finally:
        for env in env_list:
            env.close()


def measure_ceiling(flags: list[str], seconds: float) -> dict:
    """Frames per second if every core (and the GPU, with --device cuda) did nothing but useful
    work for the trainer.

    On the CPU every sample costs an env step, a forward pass and its share of the learner's
    forward+backward, all paid by the cores. With --device cuda the model runs on the GPU: the
    cores pay the env steps, the GPU pays the rest, and the ceiling is the lower of the two rates.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = appo.parse_args(flags)
        device = torch.device(cfg.device)
        env_s, num_agents = measure_env_step(flags, seconds / 3)
        spaces_pair = appo.probe_env(cfg).spaces
        # as the policy worker holds it, at the largest batch it can form (every actor asking at once)
        model = appo.ActorCritic(*spaces_pair, cfg).to(device).eval().keep_encoder_in_compute_dtype()
        inference_batch = cfg.num_workers * cfg.num_envs_per_worker * num_agents
        sample_batch = random_batch(model, spaces_pair, cfg)
        obs = {key: sample_batch[key][0, :1].expand(inference_batch, *sample_batch[key].shape[2:]).contiguous()
               .to(device) for key in model.encoders}
        rnn_state = torch.zeros(inference_batch, appo.rnn_state_size(cfg), device=device)
        inference_s = seconds_per_call(lambda: appo.act(model, obs, rnn_state), seconds / 3, device=device)
        inference_s /= inference_batch
        # the layout take_batch gives the learner: a time-first view of trajectory-major memory
        sample_batch = {key: value.transpose(0, 1).to(device).transpose(0, 1) for key, value in sample_batch.items()}
        with tempfile.TemporaryDirectory() as train_dir:
            cfg.train_dir = train_dir  # no checkpoint to resume
            learner = appo.Learner(0, cfg, None, spaces_pair)
            learner_s = seconds_per_call(lambda: learner.sgd_step(sample_batch), seconds / 3, device=device)
            learner_s /= appo.samples_per_iteration(cfg)
    finally:
        torch.set_num_threads(threads)
    cores = len(os.sched_getaffinity(0))
    frames_per_env_step = cfg.env_frameskip * num_agents
    model_s = num_agents * (inference_s + learner_s)  # per env step
    if device.type == "cuda":
        cpu_fps = cores / env_s * frames_per_env_step
        gpu_fps = frames_per_env_step / model_s
        fps = min(cpu_fps, gpu_fps)
    else:
        cpu_fps, gpu_fps = cores / (env_s + model_s) * frames_per_env_step, None
        fps = cpu_fps
    return {"fps": fps, "cores": cores, "device": str(device), "cpu_bound_fps": cpu_fps, "gpu_bound_fps": gpu_fps,
            "env_ms_per_step": env_s * 1e3, "inference_ms_per_sample": inference_s * 1e3,
            "learner_ms_per_sample": learner_s * 1e3}


# ---------------------------------------------------------------------------------------------
# Trainers: ours and Sample Factory, each read from its own log lines
# ---------------------------------------------------------------------------------------------

def trained_frames_of_ours(line: str) -> int:
    match = OURS_TRAINED.search(line) if line.startswith("[") else None
    return int(match.group(1).replace(",", "")) if match else 0


def run_logged_until(command: list[str], seconds_after_start: float, started, cwd: str = REPO,
                     env: dict | None = None, on_line=None) -> list[tuple[float, str]]:
    """Runs `command` in its own process group and returns its output as (seconds since launch,
    line) pairs; stops it `seconds_after_start` after the first line for which started(line) holds
    (or 180 s later if none comes), so that every trainer's warm-up counts from the same event.
    `on_line(process, line)`, if given, is called as each line arrives (scripts/cpu_accounting.py
    reads /proc then). Whatever the command leaves behind (processes, VizDoom's /dev/shm files) is removed."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env=env)
    lines, launch, start = [], time.monotonic(), [None]

    def read_lines():
        for line in process.stdout:
            now = time.monotonic() - launch
            lines.append((now, line.rstrip("\n")))
            if on_line is not None:
                on_line(process, line)
            if start[0] is None and started(line):
                start[0] = now

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    try:
        while process.poll() is None:
            now = time.monotonic() - launch
            if (start[0] is not None and now > start[0] + seconds_after_start) or now > 180 + seconds_after_start:
                break
            time.sleep(0.2)
        process.terminate()  # appo.py saves and stops; Sample Factory needs its group killed
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    finally:
        appo.kill_process_group(process.pid)
        process.wait()
        reader.join(timeout=5)
    return lines


def steady_windows(values: list[float]) -> dict:
    if not values:
        return {"fps": None, "windows": 0, "worst_deviation": None}
    median = statistics.median(values)
    deviations = [abs(v - median) / median for v in values] if median else [0.0]
    return {"fps": median, "windows": len(values), "worst_deviation": max(deviations),
            "within_10_percent": sum(d <= 0.1 for d in deviations) / len(deviations), "window_fps": values}


def span_rate(points: list[tuple[float, int]]) -> float | None:
    """Frames trained per second from the first to the last (seconds, total frames trained) point.
    A trainer's count grows a whole batch at a time (4,096 frames at batch 1024 and frameskip 4),
    so a 10-second window holds a whole number of batches and its FPS can only take a few values
    (Sample Factory's Atari windows read 819 or 1,229); over the whole span that error is at
    most a batch at each end."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


def measured_fps(windows: list[float], points: list[tuple[float, int]]) -> dict:
    """The span's rate as the figure; the 10-second windows say how steady it was."""
    result = steady_windows(windows)
    result["fps"] = span_rate(points) if windows else None
    return result


OURS_TRAINED = re.compile(r"trained ([\d,]+)")
OURS_BUSY = re.compile(r"busy env (\d+)% inference (\d+)% learner (\d+)%")
OURS_LAG = re.compile(r"lag \d+/([\d.]+)/\d+")


def ours_command(args, flags: list[str], train_dir: str, report_every: float) -> list[str]:
    """appo.py with these flags and the bench's own (after --), in `train_dir`, never checkpointing."""
    return [sys.executable, os.path.join(REPO, "appo.py"), *flags, *args.trainer_flags, "--train_dir", train_dir,
            "--experiment", "bench", "--report_every_sec", str(report_every), *NO_CHECKPOINTS]


def measure_ours(args, flags: list[str], extra_flags: tuple[str, ...] = ()) -> dict:
    """appo.py's FPS from the `trained` count of its status lines (every --report_every s), like Sample
    Factory's; it trains until warm-up and measurement are over, counted from its first trained frames."""
    with tempfile.TemporaryDirectory() as train_dir:
        command = ours_command(args, [*flags, *extra_flags], train_dir, args.report_every)
        lines = run_logged_until(command, args.warmup + args.seconds + args.report_every, started=trained_frames_of_ours)
    fps, busy, lags, points = [], [], [], []
    start = next((when for when, line in lines if trained_frames_of_ours(line)), None)
    for when, line in lines:
        frames = trained_frames_of_ours(line)
        if not frames or when < start + args.warmup:  # (no trained line at all: start is None, never here)
            continue
        if points:
            fps.append((frames - points[-1][1]) / (when - points[-1][0]))
            if OURS_BUSY.search(line):
                busy.append([float(v) for v in OURS_BUSY.search(line).groups()])
            if OURS_LAG.search(line):
                lags.append(float(OURS_LAG.search(line).group(1)))
        points.append((when, frames))
    fps, points = fps[:-1], points[:-1]  # the last line is printed at shutdown, over a part-window
    result = measured_fps(fps, points)
    if not fps:
        result["log_tail"] = [line for _, line in lines[-15:]]
    if busy:
        result["busy_percent"] = dict(zip(["env", "inference", "learner"], np.median(busy, axis=0).tolist()))
    result["lag_avg"] = statistics.median(lags) if lags else None
    return result


SF_FPS = re.compile(r"Fps is \(10 sec: (nan|[\d.]+),")
SF_TOTAL = re.compile(r"Total num frames: (\d+)")
# scripts/setup_sample_factory.sh installs sf_train_atari_ale: Sample Factory's Atari launcher with
# ale-py imported first (ale-py 0.9 registers the Atari ids only when imported, and Sample Factory's
# spawned workers re-import the launcher module, so a `python -c` wrapper is not enough).
SF_MODULES = {"doom": "sf_examples.vizdoom.train_vizdoom", "atari": "sf_train_atari_ale"}


def sample_factory_command(args, flags: list[str], train_dir: str) -> list[str]:
    family = args.env.split("_")[0]
    if family not in SF_MODULES:
        raise SystemExit(f"error: --sf_python: Sample Factory's launchers cover doom_* and atari_* only, not {args.env}")
    return [args.sf_python, "-m", SF_MODULES[family], *flags, *same_sgd_work_for_sample_factory(args, flags),
            "--device", "cpu", "--train_dir", train_dir, "--experiment", "bench",
            "--train_for_env_steps", str(10**12), *NO_CHECKPOINTS]


def same_sgd_work_for_sample_factory(args, flags: list[str]) -> list[str]:
    """Sample Factory's flags for the SGD work appo.py does on a batch, so that both learners
    compute the same per sample (the Atari family's defaults take 4 epochs of 4 minibatches, Doom's
    one step); the flags mean the same on both sides (--batch_size is one minibatch). Collection
    is the same on both sides: appo.py's resolved --async_rl (synchronous on Atari, as in Sample
    Factory's own Atari configuration; asynchronous on Doom). Given after the shared flags: Sample
    Factory's parser keeps the last value of a flag."""
    ours = appo.parse_args(flags + args.trainer_flags)
    return ["--batch_size", str(ours.batch_size),
            "--num_batches_per_epoch", str(ours.num_batches_per_epoch), "--num_epochs", str(ours.num_epochs),
            "--async_rl", str(ours.async_rl)]


def sf_reports_training(line: str) -> bool:
    match = SF_FPS.search(line)
    return bool(match) and match.group(1) != "nan"


@contextlib.contextmanager
def semaphores_removed():
    """Removes the multiprocessing semaphores that appear in /dev/shm meanwhile: killing Sample
    Factory's process group also kills its resource tracker, which would have removed them."""
    before = {name for name in os.listdir("/dev/shm") if name.startswith("sem.mp-")}
    try:
        yield
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith("sem.mp-") and name not in before:
                os.unlink(os.path.join("/dev/shm", name))


def measure_sample_factory(args, flags: list[str]) -> dict:
    """Sample Factory's own FPS line (frames its learner trained, over 10 s). Its
    `--train_for_seconds` never stops a run: it is stopped here after warm-up and measurement."""
    with semaphores_removed(), tempfile.TemporaryDirectory() as train_dir:
        lines = run_logged_until(sample_factory_command(args, flags, train_dir), args.warmup + args.seconds + 10,
                                 started=sf_reports_training, cwd=train_dir)
    first_fps = next((when for when, line in lines if sf_reports_training(line)), None)
    fps, last_time, points = [], None, []
    for when, line in lines:
        match = SF_FPS.search(line)
        if not match or first_fps is None or when < first_fps + args.warmup:
            continue
        if total := SF_TOTAL.search(line):
            points.append((when, int(total.group(1))))
        if last_time is None or when - last_time >= 9.5:  # its 10-second windows, without overlap
            fps.append(float(match.group(1)))
            last_time = when
    result = measured_fps(fps, points)
    if not fps:
        result["log_tail"] = [line for _, line in lines[-15:]]
    return result


# ---------------------------------------------------------------------------------------------
# One configuration, the table, the plot
# ---------------------------------------------------------------------------------------------

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure_configuration(args, envs_per_worker: int) -> dict:
    flags = trainer_config(args, envs_per_worker)
    runs = {leg: [] for leg in args.legs}
    for repeat in range(args.repeats):
        for leg in args.legs:
            print(f"# {args.env}, {args.num_workers}x{envs_per_worker} envs: {leg} "
                  f"(run {repeat + 1} of {args.repeats})", file=sys.stderr, flush=True)
            if leg == "pure":
                runs[leg].append({"fps": measure_pure_sim(flags, args.num_workers, args.seconds)})
            elif leg == "ceiling":
                runs[leg].append(measure_ceiling(flags + args.trainer_flags, args.seconds))
            elif leg == "ours":
                runs[leg].append(measure_ours(args, flags))
            elif leg == "ours_fp32":
                runs[leg].append(measure_ours(args, flags, ("--encoder_dtype", "float32")))
            else:
                runs[leg].append(measure_sample_factory(args, flags))
            if runs[leg][-1].get("log_tail"):
                print(f"warning: {leg}: no steady FPS in its log; its last lines:\n  " +
                      "\n  ".join(runs[leg][-1]["log_tail"]), file=sys.stderr)
    fps = {leg: median_or_none([run["fps"] for run in runs.get(leg, [])]) for leg in LEGS}
    result = {"env": args.env, "num_workers": args.num_workers, "num_envs": args.num_workers * envs_per_worker,
              "pure_sim_fps": fps["pure"], "ceiling_fps": fps["ceiling"], "ours_fps": fps["ours"],
              "ours_fp32_fps": fps["ours_fp32"], "sf_fps": fps["sf"], "runs": runs}
    for name, baseline in (("pure_sim", "pure"), ("ceiling", "ceiling"), ("sf", "sf")):
        result[f"ours_over_{name}"] = fps["ours"] / fps[baseline] if fps["ours"] and fps[baseline] else None
    result["ours_fp32_over_sf"] = fps["ours_fp32"] / fps["sf"] if fps["ours_fp32"] and fps["sf"] else None
    return result


def format_table(results: list[dict]) -> str:
    def cell(value, ratio=False):
        if value is None:
            return "-"
        return f"{value:.2f}" if ratio else f"{value:,.0f}"

    header = ["env", "envs", "pure sim", "ceiling", "ours", "ours fp32", "SF", "ours/pure", "ours/ceiling",
              "ours/SF", "ours fp32/SF"]
    rows = [[r["env"], str(r["num_envs"]), cell(r["pure_sim_fps"]), cell(r["ceiling_fps"]), cell(r["ours_fps"]),
             cell(r["ours_fp32_fps"]), cell(r["sf_fps"]), cell(r["ours_over_pure_sim"], True),
             cell(r["ours_over_ceiling"], True), cell(r["ours_over_sf"], True), cell(r["ours_fp32_over_sf"], True)]
            for r in results]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    lines = [" | ".join(text.rjust(width) for text, width in zip(row, widths)) for row in [header] + rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    details = []
    for r in results:
        ceiling = r["runs"].get("ceiling", [{}])[-1]
        if "env_ms_per_step" in ceiling:
            where = f"{ceiling['cores']} cores" + (" and the GPU" if ceiling.get("gpu_bound_fps") else "")
            text = (f"{r['num_envs']} envs, ceiling on {where}: env step {ceiling['env_ms_per_step']:.3f} ms, "
                    f"forward {ceiling['inference_ms_per_sample']:.3f} ms/sample, learner "
                    f"{ceiling['learner_ms_per_sample']:.3f} ms/sample")
            if ceiling.get("gpu_bound_fps"):
                text += f" (cores' bound {ceiling['cpu_bound_fps']:,.0f}, GPU's bound {ceiling['gpu_bound_fps']:,.0f})"
            details.append(text)
        per_run = {leg: [run["fps"] for run in runs if run.get("fps")] for leg, runs in r["runs"].items()}
        if any(len(fps) > 1 for fps in per_run.values()):
            details.append(f"{r['num_envs']} envs, every run: " + "; ".join(
                f"{leg} " + " ".join(f"{fps:,.0f}" for fps in values) for leg, values in per_run.items() if values))
        for leg in ("ours", "ours_fp32", "sf"):
            leg_runs = [run for run in r["runs"].get(leg, []) if run.get("fps")]
            if leg_runs:
                run = leg_runs[len(leg_runs) // 2]
                text = (f"{r['num_envs']} envs, {leg}: {run['windows']} windows of 10 s, "
                        f"{run['within_10_percent']:.0%} within 10% of the median, worst "
                        f"{run['worst_deviation']:.0%} off")
                if run.get("busy_percent"):
                    text += ", busy " + " ".join(f"{k} {v:.0f}%" for k, v in run["busy_percent"].items())
                if run.get("lag_avg") is not None:
                    text += f", policy lag {run['lag_avg']:.1f}"
                details.append(text)
    return "\n".join(lines + ["", "FPS = env frames trained per second (frameskip included), both trainers; "
                                "medians over runs. ours: appo.py's defaults (encoder precision: --encoder_dtype "
                                "auto); ours fp32: float32, like Sample Factory."] + details)


def plot(results: list[dict], path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 4))
    num_envs = [r["num_envs"] for r in results]
    for key, label in (("pure_sim_fps", "pure simulation"), ("ceiling_fps", "compute ceiling"),
                       ("ours_fps", "ours"), ("sf_fps", "Sample Factory")):
        points = [(n, r[key]) for n, r in zip(num_envs, results) if r[key] is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=label)
    axes.set_xlabel("envs (workers x envs per worker)")
    axes.set_ylabel("env frames per second")
    axes.set_title(f"{results[0]['env']}, {results[0]['num_workers']} workers, {os.cpu_count()} cores")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def provenance(args) -> dict:
    """What a result file needs to be reproduced: the command, the commit of everything that made it
    (trainer, C++ core, this bench), the files of those that differed from it, the machine."""
    def git(*command):
        return subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True).stdout.strip()
    uncommitted = git("status", "--porcelain", "--", "appo.py", "env.py", "csrc", "scripts", "setup.py")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    return {"command": " ".join(["python", script, *sys.argv[1:]]), "commit": git("rev-parse", "HEAD"),
            "uncommitted": [line[3:] for line in uncommitted.splitlines()], "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__}


def comparison_table(paths: list[str]) -> str:
    """Several result files, a row each: what a configuration or code change did to each leg."""
    files = []
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        if "provenance" not in saved:  # what --json printed (files saved before --out): figures only
            saved = {"provenance": {}, "results": saved if isinstance(saved, list) else [saved]}
        files.append((path, saved))
    legs = [leg for leg in LEGS if any(result["runs"].get(leg) for _, saved in files for result in saved["results"])]
    lines = ["| file | env | appo.py flags | commit | " + " | ".join(legs) + " |", "|---" * (4 + len(legs)) + "|"]
    for path, saved in files:
        command = saved["provenance"].get("command")
        flags = ((command.split(" -- ", 1)[1] if " -- " in command else "(defaults)") if command
                 else "(not recorded)")
        commit = saved["provenance"].get("commit", "-")[:7]
        for result in saved["results"]:
            cells = []
            for leg in legs:
                runs = [run["fps"] for run in result["runs"].get(leg, []) if run.get("fps")]
                cells.append(f"{statistics.median(runs):,.0f} ({', '.join(f'{fps:,.0f}' for fps in runs)})"
                             if runs else "-")
            lines.append(f"| {os.path.basename(path)} | {result['env']} | {flags} | {commit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    if "--report" in sys.argv:  # before parse_args: a report needs no env or trainer
        paths = list(itertools.takewhile(lambda arg: not arg.startswith("--"), sys.argv[sys.argv.index("--report") + 1:]))
        if len(paths) > 1:
            print(comparison_table(paths))
            return
        with open(paths[0]) as f:
            saved = json.load(f)
        print("\n".join(f"# {key}: {value}" for key, value in saved["provenance"].items()))
        print(format_table(saved["results"]))
        return
    args = parse_args()
    # a SIGTERM unwinds like Ctrl-C, so every leg's cleanup runs
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    error = envs.env_error(args.env)
    if error:
        raise SystemExit(f"error: --env: {error}")
    shm_before = set(os.listdir("/dev/shm"))
    results = [measure_configuration(args, envs_per_worker) for envs_per_worker in args.envs_per_worker]
    leaked = set(os.listdir("/dev/shm")) - shm_before
    if leaked:
        print(f"warning: left in /dev/shm: {sorted(leaked)}", file=sys.stderr)
    if args.plot:
        plot(results, args.plot)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": provenance(args), "results": results}, f, indent=1)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1))
    else:
        print(format_table(results))


if __name__ == "__main__":
    main()
