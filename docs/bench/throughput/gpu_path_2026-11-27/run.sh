#!/bin/bash
# alternating before/after, each checkout's own bench_throughput.py, doom_basic 2x8, ours and Sample Factory
SF=/work/main/.venv-sf/bin/python
for round in 1 2; do
  for tree in before after; do
    if [ $tree = before ]; then dir=/tmp/wt-base; else dir=/work/main; fi
    (cd $dir && python scripts/bench_throughput.py --env doom_basic --legs ours,sf --seconds 40 --warmup 20 \
       --sf_python $SF --json > /tmp/tp/${tree}_${round}.json 2> /tmp/tp/${tree}_${round}.err)
    echo "$tree $round done $(date +%T)" >> /tmp/tp/progress
  done
done
