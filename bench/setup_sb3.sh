#!/usr/bin/env bash
# Creates a separate virtual environment with Stable-Baselines3 and rl-zoo3 (its tuned
# hyperparameters and training script), so that scripts/bench_learning.py can train PPO as most
# researchers would without us (--trainers sb3), beside appo.py on the same envs.
# Why a separate environment: rl-zoo3 brings optuna, huggingface_hub and more, none of which
# appo.py needs. The envs themselves are pinned to the versions this project's interpreter has
# (gymnasium, mujoco, box2d), so that both trainers step the same dynamics.
#
# Usage: scripts/setup_sb3.sh [TARGET_DIR]   (default: <repo>/.venv-sb3)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-$REPO_ROOT/.venv-sb3}"
PYTHON="${PYTHON:-python}"

# The project's versions of the env packages (a name it lacks is left unpinned)
pinned() {
    "$PYTHON" -c "import importlib.metadata as m, sys
try:
    print(f'$1=={m.version(\"$1\")}')
except m.PackageNotFoundError:
    print('$1')"
}

"$PYTHON" -m venv "$TARGET"
PY="$TARGET/bin/python"

# torch first and pinned, as for the project: a CPU wheel is available locally, and an unpinned
# torch would pull a multi-GB CUDA build as a dependency of stable-baselines3.
"$PY" -m pip install torch==2.13.0
"$PY" -m pip install stable-baselines3==2.9.2 rl_zoo3==2.9.2 tensorboard \
    "$(pinned gymnasium)" "$(pinned mujoco)" "$(pinned box2d)" "$(pinned pygame)"  # box2d, pygame: LunarLander

echo "$PY"
