#!/usr/bin/env bash
# Creates a separate virtual environment with Sample Factory 2.1.1, so a
# benchmark can run it side by side with our trainer (appo.py).
# Why a separate environment: Sample Factory 2.1.1 pins numpy<2 and
# gymnasium<1.0, which clash with the project's own environment.
#
# Usage: scripts/setup_sample_factory.sh [TARGET_DIR]   (default: <repo>/.venv-sf)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-$REPO_ROOT/.venv-sf}"
PYTHON="${PYTHON:-python}"

"$PYTHON" -m venv "$TARGET"
PY="$TARGET/bin/python"

# torch first and pinned: a CPU wheel is available locally; an unpinned torch
# would pull a multi-GB CUDA build as a dependency of sample-factory.
"$PY" -m pip install torch==2.13.0

# opencv below 4.12: later wheels need numpy 2, which Sample Factory 2.1.1 excludes
"$PY" -m pip install sample-factory==2.1.1 ale-py==0.9.1 vizdoom "opencv-python<4.12"

# ale-py 0.9.1 registers the Atari ids (BreakoutNoFrameskip-v4, ...) only on
# `import ale_py`, and sf_examples.atari never imports it. Sample Factory
# creates envs in *spawned* processes, so importing ale_py in a `python -c`
# wrapper is not enough (the children never see it; the run hangs forever).
# This launcher module is re-imported by every spawned child (as __mp_main__),
# so: $PY -m sf_train_atari_ale --env atari_breakout ...
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat > "$SITE/sf_train_atari_ale.py" <<'PYEOF'
"""Runs sf_examples.atari.train_atari with ale-py's Atari ids registered."""
import sys

import ale_py  # noqa: F401  (registers the ALE ids with gymnasium)

from sf_examples.atari.train_atari import main

if __name__ == "__main__":
    sys.exit(main())
PYEOF

# Sample Factory has no doom_take_cover. scripts/bench_learning.py trains it there from the vizdoom
# package's take_cover.cfg, the file appo.py's doom_take_cover loads, with the same action space
# (nothing, left, right) and no reward scaling: $PY -m sf_train_vizdoom_extra --env doom_take_cover
cat > "$SITE/sf_train_vizdoom_extra.py" <<'PYEOF'
"""Runs sf_examples.vizdoom.train_vizdoom with doom_take_cover added to its scenario list."""
import os
import sys

import vizdoom
from gymnasium.spaces import Discrete

from sf_examples.vizdoom.doom.doom_utils import DOOM_ENVS, DoomSpec
from sf_examples.vizdoom.train_vizdoom import main

if not any(spec.name == "doom_take_cover" for spec in DOOM_ENVS):
    DOOM_ENVS.append(DoomSpec("doom_take_cover", os.path.join(vizdoom.scenarios_path, "take_cover.cfg"),
                              Discrete(1 + 2), 1.0))

if __name__ == "__main__":
    sys.exit(main())
PYEOF

echo "$PY"
