#!/bin/bash
# paired before/after of the planner refactor (#20): same drafter (ngram+head, gamma auto) and plain, two code trees
Q=/work/shared/data/spec_bench/question.jsonl
for r in 1 2; do
  for tree in before after; do
    cd /tmp/wt_$tree
    PYTHONPATH=/tmp/wt_$tree /work/main/.venv/bin/python -m specwise bench --out /tmp/bench/ba_${tree}_$r --questions $Q --limit-per-category 2 --rounds 1 --drafter none ngram+head --gamma auto --no-hf --threads 2 --quiet > /tmp/bench/ba_${tree}_$r.log 2>&1
  done
done
echo done
