"""A learning-rate and entropy search on doom_basic with Optuna, each trial one appo.train() call
in this process (pip install optuna). Trials run one at a time: each uses every core.

    python scripts/tools/optuna_search.py --trials 20 --frames 500000
    python scripts/tools/optuna_search.py --trials 2 --frames 20000 -- --num_workers 1   # extra flags go to every trial
"""
import argparse
import math
import os
import sys

import optuna

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import appo  # noqa: E402


def objective(trial: optuna.Trial, args) -> float:
    cfg = appo.parse_args(["--env", args.env, "--train_for_env_steps", str(args.frames),
                           "--train_dir", args.train_dir, "--experiment", f"trial_{trial.number}",
                           "--restart_behavior", "overwrite", "--seed", str(trial.number),
                           "--learning_rate", str(trial.suggest_float("learning_rate", 3e-5, 1e-3, log=True)),
                           "--exploration_loss_coeff", str(trial.suggest_float("exploration", 1e-4, 1e-2, log=True)),
                           *args.flags])
    errors = appo.flag_errors(cfg)  # what appo.main() does before training: check the flags,
    if errors:
        raise SystemExit("\n".join(errors))
    appo.start_afresh(cfg)  # and apply --restart_behavior (here: a trial of an earlier search is deleted)
    result = appo.train(cfg)
    if result.exit_code != 0 or math.isnan(result.average_returns[0]):
        raise optuna.TrialPruned(f"trial {trial.number} ended with exit code {result.exit_code}")
    return result.average_returns[0]  # the last 100 games' average score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--frames", type=int, default=500_000, help="each trial's budget")
    parser.add_argument("--train_dir", default="train_dir/optuna")
    parser.add_argument("flags", nargs="*", help="appo.py flags for every trial (after --)")
    args = parser.parse_args()
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda trial: objective(trial, args), n_trials=args.trials)
    print(f"best: {study.best_value:.2f} with {study.best_params} (trial {study.best_trial.number}, "
          f"{args.train_dir}/trial_{study.best_trial.number})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
