#!/usr/bin/env python
"""Training throughput next to what bounds it, all measured in one run on this machine.

For one env and one configuration (workers, envs per worker, splits, batch, rollout) it measures:

  pure sim   the same number of processes stepping the same envs with random actions and no
             model: the most frames per second the envs can give here
  pure_episodes  the same, but every episode is cut after --pure_episode_frames env frames (a
             trained agent's mean episode length, from `appo.py --mode eval`): an agent that
             learns ends its episodes far sooner than random play, and resets are dear, so this
             is the envs' limit for a trained run
  gpu_time   the model's two jobs timed apart, in this process, with no env: a forward pass at
             the policy worker's precision at the batch it really forms (the ours leg's mean
             inference batch when its status line gives one, else --inference_batch), and one
             learner train_step (bench/bench_learner.py); wall-clock ms and, on a GPU, CUDA
             event ms and kernel ms, each reported on its own: they run in different processes
             and streams, so neither their sum nor their minimum bounds the trainer (on the CPU,
             wall clock on one thread only)
  ours       appo.py's steady training FPS with its defaults (a bfloat16 encoder where the
             hardware has it), with how busy each kind of process was, the policy lag and, where
             its status line gives it, the policy workers' mean batch
  ours_fp32  the same with --encoder_dtype float32: Sample Factory's precision
  ours_compile  the same with --compile (torch.compile around the encoder); its start-up, from
             launch to the first trained frames, compiling included, is in each run's first_trained_s
  sf         Sample Factory 2.1.1 with the same configuration, the same SGD work per batch
             (epochs, minibatches), collection mode, policy workers and device (`--device gpu`
             where ours runs on cuda), from its own log (needs --sf_python;
             bench/setup_sample_factory.sh makes that interpreter, bench/gpu_check.py a
             wrapper on a GPU machine)

Both trainers are measured alike: FPS is env frames *trained* per second (frameskip included;
what Sample Factory's "Fps is" line counts), the frames trained between the first report after
--warmup seconds (counted from the trainer's first report of trained frames) and the last report
before it is stopped, over the seconds between them; neither writes
checkpoints during the run. The table gives ours/pure sim, ours/pure episodes, ours/SF and
ours_fp32/SF (like for like). `--json` prints
the same figures as JSON, and `--partial FILE` rewrites FILE with them after every leg (the legs
measured so far: what is left when the bench is stopped part-way); `--sweep 2,4,8` repeats everything for several envs per worker and
`--plot` draws FPS against the number of envs (the paper's Figure 3). Every leg runs for
`--seconds` (after `--warmup` for the trainers); `--repeats N` runs each leg N times and reports
medians. Nothing is left running or in /dev/shm afterwards.

  python bench/bench_throughput.py --env doom_basic
  python bench/bench_throughput.py --env atari_breakout --sf_python .venv-sf/bin/python --repeats 3
  python bench/bench_throughput.py --sweep 2,4,8,16 --legs pure,ours --plot docs/fps_vs_envs.png
  python bench/bench_throughput.py --report A.json B.json   # configurations side by side, from --out files
"""
import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import queue
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
import appo_ipc  # noqa: E402
import env as envs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_learner  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGS = ["pure", "pure_episodes", "gpu_time", "ours", "ours_fp32", "ours_compile", "sf"]
OURS_VARIANTS = {"ours_fp32": ("--encoder_dtype", "float32"), "ours_compile": ("--compile",)}  # leg: its flags
RENAMED_LEGS = {"ceiling": "gpu_time"}  # it bounded nothing: the model's stages run in different processes
NO_CHECKPOINTS = ["--save_every_sec", "100000"]  # both trainers: no checkpoint during a measurement
FIRST_LINE_S = 180.0  # a trainer that has not trained by then is stopped (VizDoom's first start is slow)


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
    parser.add_argument("--legs", default="pure,gpu_time,ours,ours_fp32,sf",
                        help="comma-separated legs to run, from: " + ",".join(LEGS) + " (gpu_time runs after ours, "
                             "whose mean inference batch it uses)")
    parser.add_argument("--pure_episode_frames", type=int, default=None,
                        help="the pure_episodes leg's episode length in env frames (frameskip included, as "
                             "`appo.py --mode eval` prints a trained agent's mean length); needed by that leg")
    parser.add_argument("--policy_workers_per_policy", type=int, default=None,
                        help="policy workers per policy, for ours and Sample Factory alike; default: appo.py's "
                             "default, given to both")
    parser.add_argument("--inference_batch", type=int, default=None,
                        help="the gpu_time leg's forward-pass batch; default: the ours leg's mean inference "
                             "batch from the same run, if its status line gives one")
    parser.add_argument("--sf_python", default=None,
                        help="interpreter of a Sample Factory 2.1.1 environment; without it the sf leg is skipped")
    parser.add_argument("--sf_first_line_s", type=float, default=FIRST_LINE_S,
                        help="the sf leg stops, with no figure and the reason, when Sample Factory has printed no "
                             "training FPS line (a non-nan 'Fps is') this many seconds after its launch")
    parser.add_argument("--sweep", default=None,
                        help="comma-separated envs-per-worker values: one row per value")
    parser.add_argument("--plot", default=None, help="PNG of FPS against the number of envs (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--partial", default=None,
                        help="rewrite this file (JSON, as --json prints it) after every leg with the legs measured "
                             "so far: what a caller reads when the bench is killed or fails part-way")
    parser.add_argument("--out", default=None,
                        help="also write a result file (JSON): the figures, the command, and the commit of the "
                             "code and bench that made them, with any uncommitted file named")
    parser.add_argument("--report", nargs="+", default=None,
                        help="run nothing: print the table of a result file from --out; of several, one row "
                             "each (its env, appo.py flags after --, and each leg's median and runs)")
    parser.add_argument("trainer_flags", nargs="*",
                        help="after --: more appo.py flags for our trainer (model flags apply to the gpu_time leg too)")
    args = parser.parse_args()
    legs = args.legs.split(",")
    for old, new in RENAMED_LEGS.items():
        if old in legs:
            print(f"note: the {old} leg is now {new}: the model's stages timed apart, not one bound", file=sys.stderr)
            legs = [new if leg == old else leg for leg in legs]
    unknown = [leg for leg in legs if leg not in LEGS]
    if unknown:
        parser.error(f"--legs: unknown leg(s) {unknown}; choose from {LEGS}")
    if "gpu_time" in legs and "ours" in legs:  # after ours: it times the batch ours formed
        legs = [leg for leg in legs if leg != "gpu_time"] + ["gpu_time"]
    if "pure_episodes" in legs and not args.pure_episode_frames:
        parser.error("--legs pure_episodes needs --pure_episode_frames (a trained agent's mean episode length)")
    if "sf" in legs and args.sf_python is None:
        legs.remove("sf")
    elif args.sf_python and not os.access(args.sf_python, os.X_OK):
        parser.error(f"--sf_python {args.sf_python} is not an executable; make one with "
                     "bench/setup_sample_factory.sh")
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

def step_randomly(env, num_agents: int, cut: bool = False) -> bool:
    """One step with random actions for every agent; a new episode when all are done, or when
    `cut` (the episode reached the length it is cut at). Returns whether a new episode began."""
    actions = env.action_space.sample() if num_agents == 1 else [env.action_space.sample() for _ in range(num_agents)]
    _, _, terminated, truncated, _ = env.step(actions)
    if isinstance(terminated, (list, tuple)):  # a multi-agent env with a flag per agent
        done = all(t or u for t, u in zip(terminated, truncated))
    else:
        done = terminated or truncated
    if done or cut:
        env.reset()
    return bool(done or cut)


def episode_steps(episode_frames: int | None, frameskip: int) -> int | None:
    """Env steps of an episode `episode_frames` env frames long (at least one); None: uncut."""
    return None if not episode_frames else max(1, round(episode_frames / frameskip))


def pure_sim_worker(flags: list[str], worker_id: int, seconds: float, ready, go, results,
                    episode_frames: int | None = None):
    """Makes and resets its envs, says so on `ready` as (worker_id, None), or (worker_id, the error)
    if it could not, then steps them once `go` is set and puts (worker_id, frames per second)."""
    appo.child_process_setup("pure-sim", owns_envs=True)
    parent = os.getppid()
    env_list = []
    try:
        try:
            cfg = appo.parse_args(flags)
            if cfg.set_workers_cpu_affinity:  # where the trainer pins its rollout workers (the Doom family), alike
                appo.pin_rollout_worker(worker_id, cfg.num_workers)
            for i in range(cfg.num_envs_per_worker):
                env_list.append(envs.create_env(cfg.env, cfg, env_index=worker_id * cfg.num_envs_per_worker + i))
            agents = [envs.get_num_agents(env) for env in env_list]
            for env in env_list:
                env.reset()
        except Exception as error:
            ready.put((worker_id, f"{type(error).__name__}: {error}"))
            raise
        ready.put((worker_id, None))
        while not go.wait(timeout=0.5):
            if not appo.parent_alive(parent):
                return
        cut_at = episode_steps(episode_frames, cfg.env_frameskip)
        steps_in_episode = [0] * len(env_list)
        agent_steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for i, (env, num_agents) in enumerate(zip(env_list, agents)):
                steps_in_episode[i] += 1
                if step_randomly(env, num_agents, cut=cut_at is not None and steps_in_episode[i] >= cut_at):
                    steps_in_episode[i] = 0
                agent_steps += num_agents  # frames of every agent, as the trainers count them
        results.put((worker_id, agent_steps * cfg.env_frameskip / (time.perf_counter() - start)))
    finally:
        for env in env_list:
            env.close()


class WorkerLost(RuntimeError):
    """A pure-simulation worker died, failed or hung before it delivered what the leg waits for."""


STARTUP_TIMEOUT_S = 300.0  # making every env (VizDoom's first start on a machine is slow)


def exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def collect_from_workers(channel, workers: list, what: str, timeout: float) -> dict:
    """(worker_id, value) from every worker, checking every half second that those not yet heard
    from are alive: a dead or failed one raises WorkerLost naming it and why, never a wait for the
    whole timeout; one that is alive but silent for `timeout` s raises it too."""
    got, deadline = {}, time.monotonic() + timeout
    while len(got) < len(workers):
        try:
            worker_id, value = channel.get(timeout=0.5)
        except queue.Empty:
            missing = [i for i in range(len(workers)) if i not in got]
            dead = [i for i in missing if workers[i].exitcode is not None]
            if dead:
                with contextlib.suppress(queue.Empty):  # what a worker put before it exited is in the pipe
                    while len(got) < len(workers):
                        worker_id, value = channel.get(timeout=0.2)
                        got[worker_id] = value
                        if isinstance(value, str):
                            raise WorkerLost(f"worker {worker_id} failed {what}: {value}")
                dead = [i for i in dead if i not in got]
            if dead:
                raise WorkerLost("; ".join(f"worker {i} (pid {workers[i].pid}) died {what} "
                                           f"({exit_reason(workers[i].exitcode)})" for i in dead))
            if time.monotonic() > deadline:
                raise WorkerLost(f"worker(s) {', '.join(map(str, missing))} still running but silent "
                                 f"{what} after {timeout:.0f} s")
            continue
        if isinstance(value, str):  # the worker's own error
            raise WorkerLost(f"worker {worker_id} failed {what}: {value}")
        got[worker_id] = value
    return got


def measure_pure_sim(flags: list[str], num_workers: int, seconds: float, episode_frames: int | None = None,
                     startup_timeout: float = STARTUP_TIMEOUT_S) -> float:
    """Frames per second of num_workers processes stepping their envs with random actions; with
    episode_frames, every episode cut at that length (the pure_episodes leg). WorkerLost names a
    worker that died or failed."""
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Queue(), context.Event(), context.Queue()
    workers = [context.Process(target=pure_sim_worker,
                               args=(flags, worker_id, seconds, ready, go, results, episode_frames))
               for worker_id in range(num_workers)]
    for worker in workers:
        worker.start()
    try:
        collect_from_workers(ready, workers, "during start-up, before it reported ready", startup_timeout)
        go.set()  # every env made and reset: the clocks start together
        fps = sum(collect_from_workers(results, workers, "while stepping its envs", seconds + 120).values())
        for worker in workers:
            worker.join(timeout=30)
        return fps
    finally:
        for worker in workers:  # after a clean finish a no-op; after an error or Ctrl-C the cleanup
            if worker.is_alive():
                worker.kill()  # a worker still starting up has no process group of its own yet
                worker.join(timeout=30)
            appo.kill_process_group(worker.pid)  # what its envs left running (VizDoom's game processes)


def pure_sim_leg(flags: list[str], num_workers: int, seconds: float, episode_frames: int | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S) -> dict:
    """One run of a pure-simulation leg, retried once if a worker was lost (the first VizDoom start on
    a fresh machine lost one once); the run's record says what was retried and why. A second loss
    ends the bench with the message."""
    lost = again = None  # messages only: a kept exception would keep the run's queues (and semaphores)
    try:
        return {"fps": measure_pure_sim(flags, num_workers, seconds, episode_frames, startup_timeout)}
    except WorkerLost as error:
        lost = str(error)
    print(f"warning: pure simulation: {lost}; running the leg again (once)", file=sys.stderr, flush=True)
    try:
        return {"fps": measure_pure_sim(flags, num_workers, seconds, episode_frames, startup_timeout), "retried": lost}
    except WorkerLost as error:
        again = str(error)
    raise SystemExit(f"error: pure simulation lost a worker twice: first {lost}; then {again}")


# ---------------------------------------------------------------------------------------------
# GPU time: the model's forward pass and the learner's step, each timed on its own
# ---------------------------------------------------------------------------------------------

def random_obs(model: appo.ActorCritic, spaces_pair, cfg, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    """A policy worker's input of `batch` actors: random observations of the env's shapes and dtypes."""
    specs = appo.rollout_buffer_specs(*spaces_pair, cfg)
    obs = {}
    for key in model.encoders:
        shape, dtype = specs[key]
        if np.dtype(dtype) == np.uint8:
            obs[key] = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8)
        else:
            obs[key] = torch.randn(batch, *shape).to(torch.from_numpy(np.zeros(0, dtype)).dtype)
    return {key: value.to(device) for key, value in obs.items()}


def measure_gpu_time(flags: list[str], seconds: float, inference_batch: int | None, batch_source: str) -> dict:
    """The forward pass at the policy worker's batch and the learner's train_step, each timed alone
    in this process: wall-clock ms and, on a GPU, CUDA event ms (and the learner's kernel ms). On the
    CPU on one thread: one core's cost. No figure here is an FPS: the stages run in different
    processes and streams, beside envs, so neither a sum nor a minimum of them bounds training."""
    cfg = appo.parse_args(flags)
    device = torch.device(cfg.device)
    cuda = device.type == "cuda"
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        probe = appo.probe_env(cfg)
        spaces_pair, num_agents = probe.spaces, probe.num_agents
        if inference_batch is None:  # one split of every worker asking at once
            inference_batch = max(1, cfg.num_workers * cfg.num_envs_per_worker * num_agents // cfg.worker_num_splits)
            batch_source = ("assumed: one split of every worker (no mean batch from the ours leg; "
                            "give --inference_batch)")
        model = appo.encoder_in_compute_dtype(appo.make_model(*spaces_pair, cfg).to(device).eval())
        obs = random_obs(model, spaces_pair, cfg, inference_batch, device)
        rnn_state = torch.zeros(inference_batch, appo.rnn_state_size(cfg), device=device)
        for _ in range(3):  # warm-up: allocations, cuDNN's choices
            appo.act(model, obs, rnn_state)
        inference = bench_learner.time_calls(lambda: appo.act(model, obs, rnn_state), seconds / 2, 5, cuda)
        learner = bench_learner.time_train_step(cfg, spaces_pair, probe.reward_shaping, seconds / 2)
    finally:
        torch.set_num_threads(threads)
    return {"fps": None, "device": str(device), "threads": "default" if cuda else 1,
            "inference_batch": inference_batch, "batch_source": batch_source,
            "inference_wall_ms_per_batch": inference["wall_ms"], "inference_event_ms_per_batch": inference["event_ms"],
            "inference_wall_us_per_sample": inference["wall_ms"] * 1e3 / inference_batch,
            "learner_batch_size": cfg.batch_size, "learner_sgd_steps_per_train_step": cfg.num_epochs *
            cfg.num_batches_per_epoch, **{f"learner_{key}": value for key, value in learner.items()}}


# ---------------------------------------------------------------------------------------------
# Trainers: ours and Sample Factory, each read from its own log lines
# ---------------------------------------------------------------------------------------------

def trained_frames_of_ours(line: str) -> int:
    match = OURS_TRAINED.search(line) if line.startswith("[") else None
    return int(match.group(1).replace(",", "")) if match else 0


def run_logged_until(command: list[str], seconds_after_start: float, started, cwd: str = REPO,
                     env: dict | None = None, on_line=None,
                     first_line_s: float = FIRST_LINE_S) -> tuple[list[tuple[float, str]], int | None]:
    """Runs `command` in its own process group and returns its output as (seconds since launch,
    line) pairs, and its exit code if it ended by itself (None: stopped here). Stops it
    `seconds_after_start` after the first line for which started(line) holds, so that every
    trainer's warm-up counts from the same event, or `first_line_s` after launch if none has come
    by then. `on_line(process, line)`, if given, is called as each line arrives
    (bench/cpu_accounting.py reads /proc then). Whatever the command leaves behind (processes,
    VizDoom's /dev/shm files) is removed."""
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
        while (exit_code := process.poll()) is None:
            now = time.monotonic() - launch
            if now > (first_line_s if start[0] is None else start[0] + seconds_after_start):
                break
            time.sleep(0.2)
        if exit_code is None:
            process.terminate()  # appo.py saves and stops; Sample Factory needs its group killed
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
    finally:
        appo.kill_process_group(process.pid)
        process.wait()
        reader.join(timeout=5)
    return lines, exit_code


def no_start(what: str, exit_code: int | None, first_line_s: float) -> str:
    """Why a trainer's leg has no figure when its first `what` never came."""
    if exit_code is None:
        return f"no {what} within {first_line_s:g} s of its launch: stopped"
    return f"{exit_reason(exit_code)} before its first {what}"


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
OURS_BATCH = re.compile(r"\binference batch (\d+)")  # the policy workers' mean batch, where the status line has it


def ours_only_flags(args) -> list[str]:
    """The bench's flags for appo.py beyond the shared configuration; Sample Factory gets ours'
    resolved values instead (same_resources_for_sample_factory), so that appo.py's defaults reach it."""
    workers = getattr(args, "policy_workers_per_policy", None)  # bench/cpu_accounting.py's args have none
    return ["--policy_workers_per_policy", str(workers)] if workers else []


def ours_command(args, flags: list[str], train_dir: str, report_every: float) -> list[str]:
    """appo.py with these flags and the bench's own (after --), in `train_dir`, never checkpointing."""
    return [sys.executable, os.path.join(REPO, "appo.py"), *flags, *ours_only_flags(args), *args.trainer_flags,
            "--train_dir", train_dir, "--experiment", "bench", "--report_every_sec", str(report_every),
            *NO_CHECKPOINTS]


def measure_ours(args, flags: list[str], extra_flags: tuple[str, ...] = ()) -> dict:
    """appo.py's FPS from the `trained` count of its status lines (every --report_every s), like Sample
    Factory's; it trains until warm-up and measurement are over, counted from its first trained frames."""
    with tempfile.TemporaryDirectory() as train_dir:
        command = ours_command(args, [*flags, *extra_flags], train_dir, args.report_every)
        lines, exit_code = run_logged_until(command, args.warmup + args.seconds + args.report_every,
                                            started=trained_frames_of_ours, first_line_s=FIRST_LINE_S)
    fps, busy, lags, batches, points, status = [], [], [], [], [], []
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
            if OURS_BATCH.search(line):
                batches.append(int(OURS_BATCH.search(line).group(1)))
        points.append((when, frames))
        status.append(line)
    fps, points = fps[:-1], points[:-1]  # the last line is printed at shutdown, over a part-window
    result = measured_fps(fps, points)
    if len(status) > 1:  # the last whole window's line: its stage shares say where each process's time went
        result["status_line"] = status[-2]
    if not fps:
        result["log_tail"] = [line for _, line in lines[-15:]]
    if start is None:
        result["error"] = no_start("status line with frames trained", exit_code, FIRST_LINE_S)
    else:
        result["first_trained_s"] = round(start, 1)  # the start-up: launch to the first frames trained
    if busy:
        result["busy_percent"] = dict(zip(["env", "inference", "learner"], np.median(busy, axis=0).tolist()))
    result["lag_avg"] = statistics.median(lags) if lags else None
    result["inference_batch"] = statistics.median(batches) if batches else None
    return result


SF_FPS = re.compile(r"Fps is \(10 sec: (nan|[\d.]+),")
SF_TOTAL = re.compile(r"Total num frames: (\d+)")
# bench/setup_sample_factory.sh installs sf_train_atari_ale: Sample Factory's Atari launcher with
# ale-py imported first (ale-py 0.9 registers the Atari ids only when imported, and Sample Factory's
# spawned workers re-import the launcher module, so a `python -c` wrapper is not enough).
SF_MODULES = {"doom": "sf_examples.vizdoom.train_vizdoom", "atari": "sf_train_atari_ale"}


def sample_factory_command(args, flags: list[str], train_dir: str) -> list[str]:
    family = args.env.split("_")[0]
    if family not in SF_MODULES:
        raise SystemExit(f"error: --sf_python: Sample Factory's launchers cover doom_* and atari_* only, not {args.env}")
    return [args.sf_python, "-m", SF_MODULES[family], *flags, *same_sgd_work_for_sample_factory(args, flags),
            *same_resources_for_sample_factory(args, flags), "--train_dir", train_dir, "--experiment", "bench",
            "--train_for_env_steps", str(10**12), *NO_CHECKPOINTS]


def ours_resolved(args, flags: list[str]):
    """appo.py's configuration for these flags, the bench's own and those after --, defaults resolved."""
    return appo.parse_args(flags + ours_only_flags(args) + args.trainer_flags)


def same_resources_for_sample_factory(args, flags: list[str]) -> list[str]:
    """Sample Factory's flags for the processes and device appo.py uses: as many policy workers
    (2.1.1 names the flag as appo.py does) and the GPU where ours runs on cuda."""
    ours = ours_resolved(args, flags)
    return ["--policy_workers_per_policy", str(ours.policy_workers_per_policy),
            "--device", "gpu" if ours.device.startswith("cuda") else "cpu"]


def same_sgd_work_for_sample_factory(args, flags: list[str]) -> list[str]:
    """Sample Factory's flags for the SGD work appo.py does on a batch, so that both learners
    compute the same per sample (the Atari family's defaults take 4 epochs of 4 minibatches, Doom's
    one step); the flags mean the same on both sides (--batch_size is one minibatch). Collection
    is the same on both sides: appo.py's resolved --async_rl (synchronous on Atari, as in Sample
    Factory's own Atari configuration; asynchronous on Doom). Given after the shared flags: Sample
    Factory's parser keeps the last value of a flag."""
    ours = ours_resolved(args, flags)
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
    before = appo_ipc.shm_entries()
    try:
        yield
    finally:  # held by no process: another run's, on the same machine, stay
        for name in appo_ipc.shm_left_since(before):
            if name.startswith("sem.mp-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join("/dev/shm", name))


def measure_sample_factory(args, flags: list[str]) -> dict:
    """Sample Factory's own FPS line (frames its learner trained, over 10 s). Its
    `--train_for_seconds` never stops a run: it is stopped here after warm-up and measurement, or
    --sf_first_line_s after launch if it has not trained by then (the result's "error" says so)."""
    with semaphores_removed(), tempfile.TemporaryDirectory() as train_dir:
        lines, exit_code = run_logged_until(sample_factory_command(args, flags, train_dir),
                                            args.warmup + args.seconds + 10, started=sf_reports_training,
                                            cwd=train_dir, first_line_s=args.sf_first_line_s)
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
    if first_fps is None:
        result["error"] = no_start("training FPS line", exit_code, args.sf_first_line_s)
    return result


# ---------------------------------------------------------------------------------------------
# One configuration, the table, the plot
# ---------------------------------------------------------------------------------------------

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


GPU_TIME_SECONDS = 6.0  # the gpu_time leg's timing needs no longer than this; the trainers' legs do


def gpu_time_batch(args, ours_runs: list[dict]) -> tuple[int | None, str]:
    """The gpu_time leg's forward-pass batch and where it came from: --inference_batch, else the
    ours leg's mean batch in this run (None when neither: measure_gpu_time says what it assumed)."""
    if args.inference_batch:
        return args.inference_batch, "--inference_batch"
    batches = [run["inference_batch"] for run in ours_runs if run.get("inference_batch")]
    if batches:
        return round(statistics.median(batches)), "the ours leg's mean inference batch"
    return None, ""


def leg_precision(args, flags: list[str]) -> dict:
    """The precision each trainer leg computes in: appo.py's resolved --encoder_dtype (auto: bfloat16
    where the device computes it natively), float32 for ours_fp32 and for Sample Factory 2.1.1, which
    has no reduced-precision setting. The pure-simulation legs run no model."""
    ours = ours_resolved(args, flags).encoder_dtype
    return {"ours": f"{ours} encoder", "gpu_time": f"{ours} encoder", "ours_fp32": "float32 encoder",
            "ours_compile": f"{ours} encoder", "sf": "float32"}


def measure_configuration(args, envs_per_worker: int, on_leg=None) -> dict:
    """Every leg of one configuration; on_leg(result so far), if given, after each leg ends."""
    flags = trainer_config(args, envs_per_worker)
    runs = {leg: [] for leg in args.legs}
    for repeat in range(args.repeats):
        for leg in args.legs:
            print(f"# {args.env}, {args.num_workers}x{envs_per_worker} envs: {leg} "
                  f"(run {repeat + 1} of {args.repeats})", file=sys.stderr, flush=True)
            shm_before = appo_ipc.shm_entries()
            if leg == "pure":
                runs[leg].append(pure_sim_leg(flags, args.num_workers, args.seconds))
            elif leg == "pure_episodes":
                runs[leg].append({**pure_sim_leg(flags, args.num_workers, args.seconds, args.pure_episode_frames),
                                  "episode_frames": args.pure_episode_frames})
            elif leg == "gpu_time":
                batch, source = gpu_time_batch(args, runs.get("ours", []))
                runs[leg].append(measure_gpu_time(flags + ours_only_flags(args) + args.trainer_flags,
                                                  min(args.seconds, GPU_TIME_SECONDS), batch, source))
            elif leg == "ours":
                runs[leg].append(measure_ours(args, flags))
            elif leg in OURS_VARIANTS:
                runs[leg].append(measure_ours(args, flags, OURS_VARIANTS[leg]))
            else:
                runs[leg].append(measure_sample_factory(args, flags))
            left = appo_ipc.shm_left_since(shm_before)  # which leg left it (a trainer's own cleanup)
            if left:
                runs[leg][-1]["shm_left"] = left
                print(f"warning: {leg} left in /dev/shm: {left}", file=sys.stderr)
            if runs[leg][-1].get("log_tail"):
                print(f"warning: {leg}: no steady FPS in its log ({runs[leg][-1].get('error', 'too few reports after the warm-up')}); "
                      "its last lines:\n  " +
                      "\n  ".join(runs[leg][-1]["log_tail"]), file=sys.stderr)
            if on_leg:
                on_leg(configuration_result(args, envs_per_worker, flags, runs))
    return configuration_result(args, envs_per_worker, flags, runs)


def configuration_result(args, envs_per_worker: int, flags: list[str], runs: dict[str, list[dict]]) -> dict:
    """One configuration's figures from the runs of the legs measured so far (the others left out)."""
    runs = {leg: leg_runs for leg, leg_runs in runs.items() if leg_runs}
    fps = {leg: median_or_none([run["fps"] for run in runs.get(leg, [])]) for leg in LEGS}
    result = {"env": args.env, "num_workers": args.num_workers, "num_envs": args.num_workers * envs_per_worker,
              "precision": leg_precision(args, flags),
              "policy_workers_per_policy": getattr(args, "policy_workers_per_policy", None),
              "pure_sim_fps": fps["pure"], "pure_episodes_fps": fps["pure_episodes"], "ours_fps": fps["ours"],
              "ours_fp32_fps": fps["ours_fp32"], "ours_compile_fps": fps["ours_compile"], "sf_fps": fps["sf"],
              "runs": runs}
    for name, baseline in (("pure_sim", "pure"), ("pure_episodes", "pure_episodes"), ("sf", "sf")):
        result[f"ours_over_{name}"] = fps["ours"] / fps[baseline] if fps["ours"] and fps[baseline] else None
    for leg in OURS_VARIANTS:
        result[f"{leg}_over_sf"] = fps[leg] / fps["sf"] if fps[leg] and fps["sf"] else None
    return result


def format_table(results: list[dict]) -> str:
    def cell(value, ratio=False):
        if value is None:
            return "-"
        return f"{value:.2f}" if ratio else f"{value:,.0f}"

    header = ["env", "envs", "pure sim", "pure episodes", "ours", "ours fp32", "ours compile", "SF", "ours/pure",
              "ours/pure episodes", "ours/SF", "ours fp32/SF", "ours compile/SF"]
    rows = [[r["env"], str(r["num_envs"]), cell(r["pure_sim_fps"]), cell(r.get("pure_episodes_fps")),
             cell(r["ours_fps"]), cell(r["ours_fp32_fps"]), cell(r.get("ours_compile_fps")), cell(r["sf_fps"]),
             cell(r["ours_over_pure_sim"], True), cell(r.get("ours_over_pure_episodes"), True),
             cell(r["ours_over_sf"], True), cell(r["ours_fp32_over_sf"], True), cell(r.get("ours_compile_over_sf"), True)]
            for r in results]  # (.get: result files from before the pure_episodes and ours_compile legs)
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    lines = [" | ".join(text.rjust(width) for text, width in zip(row, widths)) for row in [header] + rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    details = []
    for r in results:
        for run in r["runs"].get("pure_episodes", [])[-1:]:
            details.append(f"{r['num_envs']} envs, pure episodes: every episode cut at {run['episode_frames']} "
                           "env frames, random actions")
        for run in r["runs"].get("gpu_time", [])[-1:]:
            details.append(gpu_time_text(run, r["num_envs"]))
        per_run = {leg: [run["fps"] for run in runs if run.get("fps")] for leg, runs in r["runs"].items()}
        if any(len(fps) > 1 for fps in per_run.values()):
            details.append(f"{r['num_envs']} envs, every run: " + "; ".join(
                f"{leg} " + " ".join(f"{fps:,.0f}" for fps in values) for leg, values in per_run.items() if values))
        for leg in ("ours", *OURS_VARIANTS, "sf"):
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
                if run.get("first_trained_s") is not None:
                    text += f", first frames trained {run['first_trained_s']:.0f} s after launch"
                details.append(text)
    return "\n".join(lines + ["", "FPS = env frames trained per second (frameskip included), both trainers; "
                                "medians over runs. ours: appo.py's defaults (encoder precision: --encoder_dtype "
                                "auto); ours fp32: float32, like Sample Factory."] + details + [
        f"{r['num_envs']} envs, precision: " + ", ".join(f"{leg} {p}" for leg, p in r["precision"].items()
                                                        if leg in r["runs"])
        for r in results if r.get("precision")])  # (.get: result files from before it was recorded)


def gpu_time_text(run: dict, num_envs: int) -> str:
    """The gpu_time leg in words: each stage on its own, wall clock and (on a GPU) the GPU's own time."""
    def ms(wall, gpu):
        return f"{wall:.3f} ms wall" + (f", {gpu:.3f} ms GPU events" if gpu is not None else "")

    text = (f"{num_envs} envs, gpu_time on {run['device']}: forward at batch {run['inference_batch']} "
            f"({run['batch_source']}) {ms(run['inference_wall_ms_per_batch'], run['inference_event_ms_per_batch'])}; "
            f"learner train_step at batch {run['learner_batch_size']} "
            f"{ms(run['learner_wall_ms_per_step'], run['learner_event_ms_per_step'])}")
    if run.get("learner_kernel_ms_per_step") is not None:
        text += f", {run['learner_kernel_ms_per_step']:.3f} ms of kernels"
    if run.get("learner_syncs_per_step") is not None:
        text += f", {run['learner_syncs_per_step']} host syncs a step"
    return text + " (stages apart: not a bound on training)"


def plot(results: list[dict], path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 4))
    num_envs = [r["num_envs"] for r in results]
    for key, label in (("pure_sim_fps", "pure simulation"), ("pure_episodes_fps", "pure simulation, cut episodes"),
                       ("ours_fps", "ours"), ("sf_fps", "Sample Factory")):
        points = [(n, r[key]) for n, r in zip(num_envs, results) if r.get(key) is not None]
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
    uncommitted = git("status", "--porcelain", "--", "appo.py", "env.py", "csrc", "bench", "scripts", "setup.py")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    return {"command": " ".join(["python", script, *sys.argv[1:]]), "commit": git("rev-parse", "HEAD"),
            "uncommitted": [line[3:] for line in uncommitted.splitlines()], "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            # whether this CPU computes bfloat16 natively (what --encoder_dtype auto goes by on the CPU)
            "cpu_bfloat16": appo.native_bfloat16("cpu"),
            "cpu_bfloat16_flags": sorted(appo.cpu_flags() & {"avx512_bf16", "amx_bf16"})}


def load_result_file(path: str) -> dict:
    """A result file as --out writes it ({"provenance", "results"}), also from one that holds what
    --json printed: its figures, each with its provenance since --json gives one (earlier: none)."""
    with open(path) as f:
        saved = json.load(f)
    if "results" not in saved:
        results = saved if isinstance(saved, list) else [saved]
        saved = {"provenance": results[0].get("provenance", {}), "results": results}
    return saved


def comparison_table(paths: list[str]) -> str:
    """Several result files, a row each: what a configuration or code change did to each leg."""
    files = [(path, load_result_file(path)) for path in paths]
    found = [leg for _, saved in files for result in saved["results"] for leg in result["runs"]]
    # this bench's legs in its order, then those of older files (the ceiling leg, say)
    legs = list(dict.fromkeys([leg for leg in LEGS if leg in found] + found))
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


def json_output(args, results: list[dict]) -> dict | list[dict]:
    """What --json (and --partial) prints: one configuration's figures, or a list of them for a sweep
    of several, each with its provenance (commit, CPU, torch; each result holds its legs' precision),
    as a result file from --out has it: a file kept from --json's output says where it came from."""
    results = [{**result, "provenance": provenance(args)} for result in results]
    return results[0] if len(args.envs_per_worker) == 1 else results


def write_atomically(path: str, text: str):
    """A reader sees the old file or the new one, never half of one (the bench may be killed mid-write)."""
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def main():
    if "--report" in sys.argv:  # before parse_args: a report needs no env or trainer
        paths = list(itertools.takewhile(lambda arg: not arg.startswith("--"), sys.argv[sys.argv.index("--report") + 1:]))
        if len(paths) > 1:
            print(comparison_table(paths))
            return
        saved = load_result_file(paths[0])
        print("\n".join(f"# {key}: {value}" for key, value in saved["provenance"].items()))
        print(format_table(saved["results"]))
        return
    args = parse_args()
    # a SIGTERM unwinds like Ctrl-C, so every leg's cleanup runs
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    error = envs.env_error(args.env)
    if error:
        raise SystemExit(f"error: --env: {error}")
    results = []

    def write_partial(current: dict):
        if args.partial:
            write_atomically(args.partial, json.dumps(json_output(args, results + [current]), indent=1))

    for envs_per_worker in args.envs_per_worker:
        results.append(measure_configuration(args, envs_per_worker, on_leg=write_partial))
    if args.plot:
        plot(results, args.plot)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": provenance(args), "results": results}, f, indent=1)
    if args.json:
        print(json.dumps(json_output(args, results), indent=1))
    else:
        print(format_table(results))


if __name__ == "__main__":
    main()
