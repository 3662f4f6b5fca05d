#!/bin/bash
# Paired run of the epoch-path benchmarks at two commits, alternately, each from its own
# checkout (its code on PYTHONPATH, so Spark's Python workers run it too):
#   bash paired.sh BEFORE_CHECKOUT AFTER_CHECKOUT OUT_DIR     (PYTHON: the interpreter to use)
set -euo pipefail
before=$(realpath "$1"); after=$(realpath "$2"); out=$(realpath -m "$3"); py=${PYTHON:-python3}
mkdir -p "$out"
run() {  # run SIDE N BENCH ARGS...
  local tree=$before name; [ "$1" = after ] && tree=$after
  name=$(basename "$3" .py)
  (cd "$tree" && PYTHONPATH=$tree "$py" "${@:3}" > "$out/$name-$1-$2.log" 2>&1)
}
for i in 1 2; do for side in before after; do
  run $side $i bench/epoch_floor.py --json "$out/floor-$side-$i.json"; done; done
for i in 1 2; do for side in before after; do
  run $side $i bench/backlog.py --no-progress --out "$out/backlog-$side-$i"; done; done
