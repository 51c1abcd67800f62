#!/usr/bin/env python
"""The learner's step alone: milliseconds per `Learner.train_step` of the wall clock and of the
GPU, and the host synchronisations in one step, on an env's own model.

    python bench/bench_learner.py --device cuda                  # doom_basic, batch 512, rollout 32
    python bench/bench_learner.py --device cpu --seconds 2 --json
    python bench/bench_learner.py --device cpu --profile 3       # where a step's time goes, by op

The batch comes from shared rollout slots filled with random data and goes through
`Learner.take_batch`, as in training; every step after the warm-up trains on that same batch. Its
episodes end every --episode_steps steps, a trained doom_basic agent's (each trajectory at its own
phase), so that the learner's recurrent core, which on a GPU runs over the rollout cut at episode
ends, is timed at the number of segments training gives it. Reported:

  wall_ms_per_step     the wall clock over many steps, divided by their number (on a GPU the
                       queue is drained once at the end, not after each step, as in training)
  take_batch_ms        one take_batch (slots to the learner's device), wall clock
  event_ms_per_step    (GPU) CUDA events around each step: the span of the GPU stream from the
                       step's first launch to its last kernel's end, idle gaps included
  kernel_ms_per_step   (GPU) the summed duration of the step's kernels (torch.profiler): the time
                       the GPU computed. wall >> kernel means launch and wait overhead
  syncs_per_step       (GPU) host synchronisations in one step, as torch.cuda.set_sync_debug_mode
                       ("warn") reports them; with and without statistics where train_step takes
                       `report` (a report is due about once a second in training)
  profile              (--profile N) the ops that took most of N steps' time on the host, by
                       torch.profiler's self CPU time: each op's share and ms per step

On the CPU only the wall-clock figures exist; the others are null with the reason.
"""
import argparse
import inspect
import json
import os
import sys
import tempfile
import time
import types
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import appo  # noqa: E402


# A trained doom_basic agent's episode, in agent steps: it scores about 80 (the H200's train step
# 80.6, its evaluations 79.0-82.2) and basic.cfg gives +101 for the kill and -1 a tic, so an episode
# lasts about 21 tics (fewer after a missed shot's -5), some 6 steps at the Doom family's frameskip 4.
EPISODE_STEPS = 6


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default="doom_basic", help="env whose model and spaces are used")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch_size", type=int, default=512, help="samples per SGD step")
    parser.add_argument("--rollout", type=int, default=32, help="steps per trajectory")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds of steps (at least --min_steps)")
    parser.add_argument("--min_steps", type=int, default=5, help="timed steps at least")
    parser.add_argument("--warmup_steps", type=int, default=3, help="untimed steps first (cuDNN tuning, allocator)")
    parser.add_argument("--episode_steps", type=int, default=EPISODE_STEPS,
                        help="every trajectory's episodes end this many steps apart (default: a trained doom_basic "
                             "agent's)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile N steps: the ops with the most self CPU time, each one's share")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("trainer_flags", nargs="*", help="after --: more appo.py flags (model, precision)")
    return parser.parse_args(argv)


def make_learner(cfg, spaces_pair, reward_shaping):
    """A Learner with the shared objects train_step touches: one batch of slots, the published
    weights (on the GPU with --device cuda, as create_shared makes them), the run's counters."""
    slots_per_batch = appo.trajectories_per_batch(cfg)
    specs = appo.rollout_buffer_specs(*spaces_pair, cfg)
    slots = appo.RolloutSlots(specs, num_slots=slots_per_batch, rollout=cfg.rollout, num_workers=1, num_splits=1)
    device = torch.device(cfg.device)
    weights = appo.SharedWeights(appo.make_model(*spaces_pair, cfg), device=device if device.type == "cuda" else None)
    run = types.SimpleNamespace(learner_frames=np.zeros(1, np.int64), learner_version=np.zeros(1, np.int64))
    shared = types.SimpleNamespace(slots=slots, weights=[weights], run=run,
                                   hyperparams=appo.PolicyHyperparams(cfg, reward_shaping))
    return appo.Learner(0, cfg, shared, spaces_pair), slots


def fill_randomly(slots, model, seed: int = 0, episode_steps: int = EPISODE_STEPS):
    """Random observations and actions the action space allows; every step valid, an episode end
    every `episode_steps` steps of each trajectory, at a random phase."""
    generator = torch.Generator().manual_seed(seed)
    tensors = slots.tensors
    for key in model.encoders:
        if tensors[key].dtype == torch.uint8:
            tensors[key].copy_(torch.randint(0, 256, tensors[key].shape, dtype=torch.uint8, generator=generator))
        else:
            tensors[key].copy_(torch.randn(tensors[key].shape, generator=generator))
    # actions of any space, drawn from the model's own distribution at random logits
    logits = torch.randn(*tensors["actions"].shape[:2], model.action_dist.num_params, generator=generator)
    tensors["actions"].copy_(model.action_dist.sample(logits).to(tensors["actions"].dtype))
    tensors["log_prob"].fill_(-1.0)
    tensors["reward"].copy_(torch.randn(tensors["reward"].shape, generator=generator))
    num_slots, steps = tensors["done"].shape
    phase = torch.randint(0, episode_steps, (num_slots, 1), generator=generator)
    ends = (torch.arange(steps) + phase) % episode_steps == episode_steps - 1
    tensors["done"].copy_(ends.to(tensors["done"].dtype))
    tensors["valid"].fill_(1.0)


def step_function(learner):
    """train_step as training calls it when no report is due, where it takes `report`."""
    if "report" in inspect.signature(learner.train_step).parameters:
        return (lambda batch: learner.train_step(batch, report=False)), (lambda batch: learner.train_step(batch, report=True))
    return learner.train_step, None


def count_syncs(function) -> int:
    """Host synchronisations torch's sync debug mode warns about during one call."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            function()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(warning.message) for warning in caught)


def kernel_ms(function, calls: int) -> float:
    """Milliseconds of GPU kernels per call, from torch.profiler's self device times."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(calls):
            function()
        torch.cuda.synchronize()
    total_us = 0.0
    for event in profiler.key_averages():
        total_us += getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
    return total_us / 1e3 / calls


def op_shares(function, calls: int, most: int = 12) -> list[dict]:
    """The ops with the most self CPU time over `calls` calls (torch.profiler): name, share of all
    ops' self CPU time, ms per call."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(calls):
            function()
    events = sorted(profiler.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total_us = sum(event.self_cpu_time_total for event in events)
    return [{"op": event.key, "share": round(event.self_cpu_time_total / total_us, 4),
             "ms_per_call": round(event.self_cpu_time_total / 1e3 / calls, 3)} for event in events[:most]]


def time_calls(function, seconds: float, min_calls: int, cuda: bool) -> dict:
    """Wall-clock ms per call over many calls (on a GPU the queue is drained once, at the end) and,
    on a GPU, the mean ms between CUDA events recorded around each call."""
    if cuda:
        torch.cuda.synchronize()
    events, calls, started = [], 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - started < seconds:
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        function()
        if cuda:
            end.record()
            events.append((begin, end))
        calls += 1
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    return {"calls": calls, "wall_ms": wall / calls * 1e3,
            "event_ms": float(np.mean([begin.elapsed_time(end) for begin, end in events])) if cuda else None}


def time_train_step(cfg, spaces_pair, reward_shaping, seconds: float, min_steps: int = 5,
                    warmup_steps: int = 3, episode_steps: int = EPISODE_STEPS, profile_steps: int = 0) -> dict:
    """train_step on cfg's model and batch: the figures of the module docstring."""
    cuda = torch.device(cfg.device).type == "cuda"
    result = {}
    with tempfile.TemporaryDirectory() as train_dir:
        cfg.train_dir = train_dir  # nothing to resume
        learner, slots = make_learner(cfg, spaces_pair, reward_shaping)
        fill_randomly(slots, learner.model, episode_steps=episode_steps)
        taken = [slots.control.acquire(0, timeout=1.0) for _ in range(appo.trajectories_per_batch(cfg))]
        started = time.perf_counter()
        batch = learner.take_batch(taken)
        if cuda:
            torch.cuda.synchronize()
        result["take_batch_ms"] = (time.perf_counter() - started) * 1e3
        quiet_step, reporting_step = step_function(learner)
        for _ in range(warmup_steps):
            quiet_step(batch)
        timed = time_calls(lambda: quiet_step(batch), seconds, min_steps, cuda)
        result.update(steps=timed["calls"], wall_ms_per_step=timed["wall_ms"], event_ms_per_step=timed["event_ms"],
                      report_argument=reporting_step is not None)
        if cuda:
            try:
                result["kernel_ms_per_step"] = kernel_ms(lambda: quiet_step(batch), calls=min(timed["calls"], 5))
            except Exception as error:  # the profiler may be unavailable; the rest stands
                result["kernel_ms_per_step"], result["kernel_ms_error"] = None, f"{type(error).__name__}: {error}"
            result["syncs_per_step"] = count_syncs(lambda: quiet_step(batch))
            result["syncs_per_step_with_report"] = (count_syncs(lambda: reporting_step(batch))
                                                    if reporting_step else None)
        else:
            result.update(kernel_ms_per_step=None, syncs_per_step=None, syncs_per_step_with_report=None,
                          gpu_figures="no GPU: --device cpu")
        if profile_steps:
            result["profile"] = op_shares(lambda: quiet_step(batch), profile_steps)
    return result


def measure(args) -> dict:
    flags = ["--env", args.env, "--device", args.device, "--batch_size", str(args.batch_size),
             "--rollout", str(args.rollout), *args.trainer_flags]
    cfg = appo.parse_args(flags)
    cuda = torch.device(cfg.device).type == "cuda"
    probe = appo.probe_env(cfg)
    result = {"env": args.env, "device": cfg.device, "batch_size": cfg.batch_size, "rollout": cfg.rollout,
              "sgd_steps_per_train_step": cfg.num_epochs * cfg.num_batches_per_epoch,
              "encoder_dtype": cfg.encoder_dtype, "episode_steps": args.episode_steps, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "gpu": torch.cuda.get_device_name(0) if cuda else None}
    result.update(time_train_step(cfg, probe.spaces, probe.reward_shaping, args.seconds, args.min_steps,
                                  args.warmup_steps, args.episode_steps, args.profile))
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no GPU (use --device cpu)")
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            if key == "profile":
                print("profile (self CPU time of each op: share, ms a step):")
                for row in value:
                    print(f"  {row['share']:6.1%} {row['ms_per_call']:10.1f}  {row['op']}")
            else:
                print(f"{key}: {round(value, 3) if isinstance(value, float) else value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
