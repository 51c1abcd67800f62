#!/usr/bin/env bash
# The test suite on a loaded machine: the README's test command PASSES times back to back while
# `python appo.py --env doom_basic` trains beside it on the same cores, stopping at the first pass
# that fails. Run it from a checkout whose C++ module is built (`pip install -e .`, or
# `python setup.py build_ext --inplace`), alone on the machine, in the background: a pass takes
# 1-2 hours on 2 cores.
#   nohup setsid bench/suite_under_load.sh > /tmp/suite_under_load.out 2>&1 &
#   PASSES=1 PYTEST_ARGS="" bench/suite_under_load.sh      # one test at a time instead
# Writes docs/bench/suite/<commit>_<date>_beside_doom_basic_pass<N>.txt: the command, commit,
# machine and times in its first lines, then pytest's output with each slow test's time. The logs
# are written in a folder in /tmp (printed at the start) and moved there when the script ends: a log
# in docs/bench/suite/ while passes still run would fail the test that each log there has its row in
# docs/testing.md.
set -uo pipefail
cd "$(dirname "$0")/.."

PASSES="${PASSES:-2}"
PYTEST_ARGS="${PYTEST_ARGS--n 2 --dist worksteal}"  # the README's command: two tests at a time
OUT_DIR="${OUT_DIR:-docs/bench/suite}"
TRAIN_DIR="$(mktemp -d /tmp/suite_under_load_train.XXXXXX)"
LOG_DIR="$(mktemp -d /tmp/suite_under_load_logs.XXXXXX)"
echo "logs in $LOG_DIR until the script ends"
commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
stamp=$(date -u +%Y-%m-%d)
cpu=$(lscpu | sed -n 's/^Model name: *//p')
bf16=$(lscpu | grep -q 'avx512_bf16\|amx_bf16' && echo yes || echo no)
torch_version=$(python -c 'import torch; print(torch.__version__)')
mkdir -p "$OUT_DIR"

# The load: a training run of its own session, so that stopping it stops all of its processes.
setsid python appo.py --env doom_basic --train_dir "$TRAIN_DIR" > "$TRAIN_DIR/stdout.log" 2>&1 &
train_pid=$!
stop_training_and_keep_logs() {
  kill -INT -- "-$train_pid" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$train_pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$train_pid" 2>/dev/null
  rm -rf "$TRAIN_DIR"
  mv "$LOG_DIR"/* "$OUT_DIR"/ 2>/dev/null; rmdir "$LOG_DIR"  # empty now, or empty from the start
}
trap stop_training_and_keep_logs EXIT
trap 'exit 143' INT TERM  # through the EXIT trap
sleep 60  # past its start-up: the suite starts beside a run that trains

status=0
for pass in $(seq "$PASSES"); do
  log="$LOG_DIR/${commit}_${stamp}_beside_doom_basic_pass$pass.txt"
  command="python -m pytest -q -rs -p no:cacheprovider --durations=60 $PYTEST_ARGS"
  {
    echo "# $command, in a checkout of $commit$dirty, beside \`python appo.py --env doom_basic\` training on the same $(nproc) cores: pass $pass of $PASSES (bench/suite_under_load.sh)"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC') start; $cpu, $(nproc) cores, bfloat16: $bf16; torch $torch_version"
  } > "$log"
  start=$(date +%s)
  $command >> "$log" 2>&1
  status=$?
  training=$(kill -0 "$train_pid" 2>/dev/null && echo "still training" || echo "NOT training any more")
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC') end: exit status $status after $(( $(date +%s) - start )) s; the run beside it $training" >> "$log"
  echo "pass $pass: exit status $status ($OUT_DIR/$(basename "$log") when the script ends)"
  [ "$status" = 0 ] || break
done
exit "$status"
