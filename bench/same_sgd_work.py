#!/usr/bin/env python
"""Do the learning bench's saved configurations still mean the same training? For changes to flag
meanings or family defaults: each saved appo.py configuration (docs/bench/learning and
docs/bench/ablations) resolved at an older commit and here, compared by the SGD work it sets.

    python bench/same_sgd_work.py 6d15385

Prints one line a configuration, SAME or DIFFERENT (samples an iteration, minibatch, epochs,
collection, learning rate and schedule), and exits 1 if any differs.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESOLVE = """
import json, sys
import appo
iteration = getattr(appo, "samples_per_iteration", lambda cfg: cfg.batch_size)  # before: --batch_size
out = {}
for flags in json.loads(sys.argv[1]):
    cfg = appo.parse_args(flags)
    out[json.dumps(flags)] = {"iteration": iteration(cfg), "minibatch": iteration(cfg) // cfg.num_batches_per_epoch,
                              "epochs": cfg.num_epochs, "async_rl": cfg.async_rl,
                              "learning_rate": cfg.learning_rate, "lr_schedule": cfg.lr_schedule}
print(json.dumps(out))
"""


def saved_configurations() -> list[list[str]]:
    configs = set()
    for path in glob.glob(os.path.join(REPO, "docs", "bench", "*", "**", "appo_seed*.json"), recursive=True):
        config = json.load(open(path))["config"]
        configs.add(json.dumps(["--env", config["env"], *config["system"], *config.get("extra_flags", [])]))
    return [json.loads(config) for config in sorted(configs)]


def resolve(repo: str, configs: list[list[str]]) -> dict:
    run = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(configs)], cwd=repo, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=repo), check=True)
    return json.loads(run.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the older commit")
    args = parser.parse_args()
    configs = saved_configurations()
    old = tempfile.mkdtemp(prefix="same_sgd_work_")
    subprocess.run(["git", "worktree", "add", "--detach", old, args.commit], cwd=REPO, check=True, capture_output=True)
    try:
        modules = glob.glob(os.path.join(REPO, "csrc", "_native*.so"))  # appo_ipc's C++ module, built in place
        if modules and os.path.exists(os.path.join(old, "csrc", "__init__.py")):  # parsing flags needs no C++ change
            subprocess.run(["cp", modules[0], os.path.join(old, "csrc")], check=True)
        else:  # a commit from before csrc/ became the appo_ipc package: its module has another name
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=old, check=True,
                           capture_output=True)
        before, after = resolve(old, configs), resolve(REPO, configs)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old], cwd=REPO, capture_output=True)
    different = 0
    for key in before:
        same = before[key] == after[key]
        different += not same
        print(f"{'SAME' if same else 'DIFFERENT'} | {' '.join(json.loads(key))} | {after[key]}"
              + ("" if same else f" | {args.commit}: {before[key]}"))
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
