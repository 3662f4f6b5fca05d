#!/bin/bash
# Paired: before (13e3345) and after (902aa62) alternately, each from its own tree.
PY=/work/venv-main/bin/python
for i in 1 2; do
  for side in before after; do
    tree=/work/wt-before; [ $side = after ] && tree=/work/main
    (cd $tree && PYTHONPATH=$tree $PY bench/epoch_floor.py --json bench/results/arch-33/out/floor-$side-$i.json > bench/results/arch-33/out/floor-$side-$i.log 2>&1)
  done
done
for i in 1 2; do
  for side in before after; do
    tree=/work/wt-before; [ $side = after ] && tree=/work/main
    (cd $tree && PYTHONPATH=$tree $PY bench/backlog.py --no-progress --out bench/results/arch-33/out/backlog-$side-$i > bench/results/arch-33/out/backlog-$side-$i.log 2>&1)
  done
done
echo done
