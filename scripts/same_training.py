#!/usr/bin/env python
"""Does the code here train exactly as an older commit did? For refactors that must not change
what is learned: a seeded --serial_mode run (every process in one, so the steps are repeatable)
at each commit, and the SHA-256 of the final checkpoint's weights and Adam state compared.

    python scripts/same_training.py 1835f39                       # six configurations
    python scripts/same_training.py 1835f39 --flags "--env doom_basic --with_vtrace"

The older commit is checked out into a temporary git worktree (deleted afterwards), with the C++
module built there unless csrc/ is the same at both commits (then this checkout's is copied).
Prints one line a configuration, SAME or DIFFERENT, and exits 1 if any differs.

Re-pins: commits that changed what a seeded run computes on purpose, each shown harmless by the
learning bench. Compare a refactor against a commit at or after the latest.
- 70ed530 (2026-11-28, issue 58): one path on every device for the normalisers' moments and the
  optimizer's non-finite skip (fused Adam), and the learner starting from the weights published
  as version 0 (docs/results/learning.md, "Re-pin of 2026-11-28").
- e4725c7 (2026-12-05, issue 79): the model calls its recurrent cell (torch's GRUCell/LSTMCell
  kernels instead of their equations written out), the learner trains torch's own cells with
  SegmentRNN (packed segments) on the CPU too, and V-trace's targets fold into the return statistics
  after their minibatch's step (the loss changes nothing). Every configuration with a GRU moved;
  CartPole's (no RNN, GAE) did not (docs/results/learning.md, "Re-pin of 2026-12-05"; 894d4bf, the
  same with padded segments, is superseded).
Not a re-pin: 2026-12-07 (issue 95), every child process seeds its generators from --seed, its role
and its index (appo.seed_process). Serial runs draw as before (SAME 6/6 against the commit before:
--serial_mode runs every role in the runner's process, on the stream it always seeded); what moved
is the multi-process runs' sampling, which had come from the fork server's random state, so that no
two of them could be repeated (tests/test_seeding.py repeats one now).
"""
import argparse
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [
    "--env doom_basic",  # GAE, the Doom family's defaults
    "--env doom_basic --with_vtrace --normalize_returns",
    # minibatches of 64 (of the 128 of COMMON before 2026-11-26, when --batch_size was the iteration)
    "--env doom_basic --num_epochs 2 --num_batches_per_epoch 2 --lr_schedule linear_decay --batch_size 64",
    "--env doom_basic --with_vtrace --normalize_returns --num_epochs 2 --num_batches_per_epoch 2 --batch_size 64",
    "--env doom_basic --normalize_returns --max_policy_lag 1",
    "--env gym:CartPole-v1 --batch_size 32",  # synchronous, 2 epochs x 4 minibatches of 32, no RNN
]
COMMON = ["--serial_mode", "--num_workers", "1", "--num_envs_per_worker", "4", "--rollout", "16", "--batch_size", "128",
          "--hidden_size", "64", "--seed", "1", "--train_for_env_steps", "20000", "--experiment", "same"]
# Defaults changed on purpose and measured (docs/results/learning.md), held at their old values on
# each side whose appo.py has the flag, so that runs of older code stay comparable.
OLD_DEFAULTS = {"--value_bootstrap": "--no-value_bootstrap"}  # issue 80: Doom, gym: (12-05), Atari (12-06)
CHECKSUM = """
import glob, hashlib, sys, torch
path = sorted(glob.glob(sys.argv[1] + "/same/checkpoint_p0/*.pth"))[-1]
state = torch.load(path, map_location="cpu", weights_only=True)
digest = hashlib.sha256()
for key, value in state["model"].items():
    digest.update(key.encode()); digest.update(value.numpy().tobytes())
for _, moments in sorted(state["optimizer"]["state"].items()):
    for name in sorted(moments):
        digest.update(moments[name].numpy().tobytes())
print(state["policy_version"], digest.hexdigest())
"""


def train_and_hash(repo: str, flags: list[str]) -> str:
    with tempfile.TemporaryDirectory() as train_dir:
        env = dict(os.environ, PYTHONPATH=repo)
        with open(os.path.join(repo, "appo.py")) as f:
            source = f.read()
        held = [old for flag, old in OLD_DEFAULTS.items() if f'"{flag}"' in source]
        run = subprocess.run([sys.executable, "appo.py", *COMMON, *held, *flags, "--train_dir", train_dir], cwd=repo,
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            return f"failed: {(run.stdout + run.stderr).strip().splitlines()[-1:]}"
        return subprocess.run([sys.executable, "-c", CHECKSUM, train_dir], cwd=repo, env=env, capture_output=True,
                              text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the older commit")
    parser.add_argument("--flags", action="append", help="one configuration's flags (repeatable); default: six")
    parser.add_argument("--before_flags", action="append",
                        help="the same configuration spelt for the older commit, one per --flags, where a flag's "
                             "spelling changed (e.g. --batch_size, the iteration before 2026-11-26, a minibatch after)")
    args = parser.parse_args()
    configs = args.flags or CONFIGS
    before_configs = args.before_flags or configs
    if len(before_configs) != len(configs):
        parser.error("--before_flags: give one for every --flags")
    old = tempfile.mkdtemp(prefix="same_training_")
    subprocess.run(["git", "worktree", "add", "--detach", old, args.commit], cwd=REPO, check=True, capture_output=True)
    try:
        same_csrc = subprocess.run(["git", "diff", "--quiet", args.commit, "--", "csrc"], cwd=REPO).returncode == 0
        modules = glob.glob(os.path.join(REPO, "csrc", "_native*.so"))  # appo_ipc's C++ module, built in place
        if same_csrc and modules:
            shutil.copy(modules[0], os.path.join(old, "csrc"))
        else:
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=old, check=True)
        different = 0
        for config, before_config in zip(configs, before_configs):
            before, after = train_and_hash(old, shlex.split(before_config)), train_and_hash(REPO, shlex.split(config))
            same = before == after and not before.startswith("failed")
            different += not same
            print(f"{'SAME' if same else 'DIFFERENT'} | {config} | {args.commit}: {before} | here: {after}", flush=True)
        return 1 if different else 0
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old], cwd=REPO, capture_output=True)
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
