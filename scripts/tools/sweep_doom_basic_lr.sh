#!/usr/bin/env bash
# Seeds x learning rate on doom_basic: one experiment per pair, MAX_PARALLEL runs at a time.
#   scripts/tools/sweep_doom_basic_lr.sh                      # 3 seeds x 3 learning rates, 1 at a time
#   SEEDS="1 2" LRS="1e-4 3e-4" MAX_PARALLEL=2 scripts/tools/sweep_doom_basic_lr.sh --num_workers 4
# Extra arguments go to every run. Each run logs to $TRAIN_DIR/$SWEEP/<name>.log; plot with
#   python scripts/tools/plot.py train_dir/$SWEEP/doom_basic_lr* --target 75 --out $SWEEP.png
set -euo pipefail
cd "$(dirname "$0")/../.."

SWEEP="${SWEEP:-sweep_doom_basic_lr}"
TRAIN_DIR="${TRAIN_DIR:-train_dir}"
SEEDS="${SEEDS:-1 2 3}"
LRS="${LRS:-5e-5 1e-4 3e-4}"
MAX_PARALLEL="${MAX_PARALLEL:-1}"
STEPS="${STEPS:-500000}"
mkdir -p "$TRAIN_DIR/$SWEEP"

trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' INT TERM  # Ctrl-C stops every run cleanly

for lr in $LRS; do
  for seed in $SEEDS; do
    while [ "$(jobs -rp | wc -l)" -ge "$MAX_PARALLEL" ]; do wait -n; done
    name="doom_basic_lr${lr}_seed${seed}"
    echo "starting $name"
    python appo.py --env doom_basic --train_dir "$TRAIN_DIR/$SWEEP" --experiment "$name" \
      --seed "$seed" --learning_rate "$lr" --train_for_env_steps "$STEPS" "$@" \
      > "$TRAIN_DIR/$SWEEP/$name.log" 2>&1 &
  done
done
wait
echo "done: python scripts/tools/plot.py $TRAIN_DIR/$SWEEP/doom_basic_lr* --target 75 --out $SWEEP.png"
