#!/usr/bin/env bash
# Training FPS against the number of envs (the paper's Figure 3) for one or more envs:
# pure simulation, ours, the GPU-time leg and (with SF_PYTHON) Sample Factory at each size.
#   bench/sweep_throughput.sh                                   # doom_basic, 2 workers x 2..16 envs
#   ENVS="doom_basic atari_breakout" SF_PYTHON=.venv-sf/bin/python bench/sweep_throughput.sh
# Writes docs/fps_<env>.png and docs/fps_<env>.json.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVS="${ENVS:-doom_basic}"
ENVS_PER_WORKER="${ENVS_PER_WORKER:-2,4,8,16}"
WORKERS="${WORKERS:-2}"
SECONDS_PER_LEG="${SECONDS_PER_LEG:-60}"
sf=()
if [ -n "${SF_PYTHON:-}" ]; then sf=(--sf_python "$SF_PYTHON"); fi

for env in $ENVS; do
  python bench/bench_throughput.py --env "$env" --num_workers "$WORKERS" --sweep "$ENVS_PER_WORKER" \
    --seconds "$SECONDS_PER_LEG" "${sf[@]}" --plot "docs/fps_$env.png" --json "$@" | tee "docs/fps_$env.json"
done
