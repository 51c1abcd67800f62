#!/usr/bin/env python
"""What a trained gym: policy does, beyond its score: plays a checkpoint for a few episodes, sampling
its actions as training did, and prints one JSON line: the return, how wide and how saturated its
actions are, and for MuJoCo's planar walkers the posture and speed of the torso.

    python bench/probe_policy.py docs/bench/gym_basin/gym:HalfCheetah-v5/appo_seed1.pth
    python bench/probe_policy.py CHECKPOINT --episodes 5 --deterministic

Posture and speed are read from the observation at the indices gymnasium documents for the v5 envs
(POSTURE): obs[1] is the torso's pitch (qpos[2], radians; 0 upright, +-pi upside down) and the first
velocity, right after the positions, the torso's forward speed (m/s). `upside_down` is the share of
steps with cos(pitch) < 0. Made to tell the HalfCheetah runs that end near 1,500 from those near 4,000
(docs/results/learning.md).
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import appo  # noqa: E402

# env id -> (index of the torso's pitch, index of its forward speed) in the v5 observation: the
# positions without the x coordinate come first (qpos[1:]), then the velocities (qvel).
POSTURE = {"HalfCheetah-v5": (1, 8), "Hopper-v5": (1, 5), "Walker2d-v5": (1, 8)}


def probe(checkpoint_path: str, episodes: int, deterministic: bool, seed: int) -> dict:
    checkpoint = appo.load_checkpoint_file(checkpoint_path, "CHECKPOINT")
    env_name = checkpoint["cfg"]["env"]
    cfg = appo.parse_args(["--mode", "eval", "--env", env_name, "--checkpoint", checkpoint_path, "--seed", str(seed),
                           "--device", "cpu"])
    appo.load_policy_for_eval(cfg)  # the checkpoint's model and env flags
    torch.manual_seed(seed)
    env = appo.make_env(cfg, env_index=0)
    if env.num_agents != 1:
        raise SystemExit(f"{env_name}: the probe plays single-agent envs")
    obs_space, action_space = env.agent_spaces[0]
    model = appo.make_model(obs_space, action_space, cfg).eval()
    model.load_state_dict(checkpoint["model"])
    pitch_at, speed_at = POSTURE.get(env_name.removeprefix("gym:"), (None, None))
    returns, raw_actions, pitches, speeds, episode_starts = [], [], [], [], [0]
    rnn_state = torch.zeros(1, appo.rnn_state_size(cfg))
    obs = env.reset()
    with torch.no_grad():
        while len(returns) < episodes:
            raw = obs[0]["obs"] if isinstance(obs[0], dict) and "obs" in obs[0] else obs[0]
            if pitch_at is not None:
                pitches.append(float(raw[pitch_at]))
                speeds.append(float(raw[speed_at]))
            batch = {key: torch.as_tensor(np.asarray(obs[0][key] if isinstance(obs[0], dict) else obs[0]))[None]
                     for key in model.encoders}
            logits, _, rnn_state = model(batch, rnn_state)
            action = model.action_dist.mode(logits) if deterministic else model.action_dist.sample(logits)
            raw_actions.append(action[0].numpy())
            obs, _, dones, _, infos = env.step([appo.env_action(action_space, action[0].numpy())])
            if "true_return" in infos[0]:
                returns.append(float(infos[0]["true_return"]))
            if dones[0]:
                episode_starts.append(len(pitches))
                obs = env.reset()
                rnn_state.zero_()
    env.close()
    actions = np.stack(raw_actions)
    report = {"checkpoint": checkpoint_path, "env": env_name, "env_frames": checkpoint["env_frames"],
              "episodes": episodes, "deterministic": deterministic, "mean_return": float(np.mean(returns)),
              "returns": [round(r, 1) for r in returns]}
    if hasattr(action_space, "low"):  # a Box: how wide the policy's Gaussian is, how often it leaves the box
        log_std = model.action_dist.split(logits)[1]
        report["policy_std"] = [round(float(s), 3) for s in log_std.exp().flatten()]
        report["mean_abs_action"] = round(float(np.abs(actions).mean()), 3)
        low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
        report["clipped_share"] = round(float(((actions < low) | (actions > high)).mean()), 3)
    if pitch_at is not None:
        pitch = np.array(pitches)
        report["upside_down"] = round(float((np.cos(pitch) < 0).mean()), 3)
        report["mean_cos_pitch"] = round(float(np.cos(pitch).mean()), 3)
        report["forward_speed"] = round(float(np.mean(speeds)), 3)
        # how far over each game's torso went (the pitch hinge is unbounded: 360 is a whole somersault)
        report["max_abs_pitch_deg"] = [round(math.degrees(float(np.abs(pitch[start:end]).max())))
                                       for start, end in zip(episode_starts, episode_starts[1:]) if end > start]
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoint_*.pth files (the bench's --keep_checkpoints)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--deterministic", action="store_true", help="the Gaussian's mean, not a sample")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write every report to this file, with the command and the commit")
    args = parser.parse_args()
    reports = []
    for path in args.checkpoints:
        reports.append(probe(path, args.episodes, args.deterministic, args.seed))
        print(json.dumps(reports[-1]), flush=True)
    if args.json:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python", *sys.argv]), "commit": commit, "reports": reports}, f, indent=1)


if __name__ == "__main__":
    main()
