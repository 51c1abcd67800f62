#!/usr/bin/env bash
# Throughput of the Doom match envs (README table): pure simulation with random actions, the
# the GPU-time leg and our trainer, 16 agents each (2 workers; 8 envs of one agent, or 4 duels).
#   bench/bench_doom_matches.sh                 # doom_duel_bots, doom_duel, doom_deathmatch_bots
#   ENVS=doom_deathmatch_full REPEATS=1 bench/bench_doom_matches.sh
# Frames count every agent's frames at the envs' default frameskip (2).
set -euo pipefail
cd "$(dirname "$0")/.."

ENVS="${ENVS:-doom_duel_bots doom_duel doom_deathmatch_bots}"
REPEATS="${REPEATS:-3}"
SECONDS_PER_LEG="${SECONDS_PER_LEG:-60}"

for env in $ENVS; do
  envs_per_worker=8
  case "$env" in
    doom_duel) envs_per_worker=4 ;;            # 2 agents per env
    doom_deathmatch_full) envs_per_worker=2 ;; # 4 agents per env
  esac
  python bench/bench_throughput.py --env "$env" --num_envs_per_worker "$envs_per_worker" \
    --legs pure,ours,gpu_time --repeats "$REPEATS" --seconds "$SECONDS_PER_LEG" "$@"
done
