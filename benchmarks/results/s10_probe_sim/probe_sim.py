"""Synthetic check of the optimistic probing tried in session 10 (commit 07be51d, since reverted).

It needs that commit's schedule (probe_limit, explore):

    git worktree add /tmp/ucb 07be51d
    PYTHONPATH=/tmp/ucb python benchmarks/results/s10_probe_sim/probe_sim.py > benchmarks/results/s10_probe_sim/output.txt

A drafter accepted with probability acc per position, a 2-token pass costing c2 plain ones, drafting 0.05 of one;
"old" is probing every 8 plain steps (probe_limit=8, explore=0), "new" the optimistic probing. Rate: tokens per
unit of time (plain decoding = 1).
"""

import random

from specwise.schedule import AdaptiveGamma


def run(acc, c2, dc, probe_limit=None, explore=1.0, steps=2000, seed=0):
    rng = random.Random(seed)
    s = AdaptiveGamma(max_gamma=6, cost_curve={2: c2, 3: c2 + 0.1}, probe_limit=probe_limit, explore=explore)
    cost = lambda k: 1.0 if k == 1 else c2 + 0.1 * (k - 2)
    asks = 0
    tokens = 0
    time = 0.0
    for _ in range(steps):
        g = s.choose(8)
        acc_n = 0
        while acc_n < g and rng.random() < acc:
            acc_n += 1
        s.observe(g, acc_n, g * dc, cost(g + 1))
        asks += g > 0
        tokens += 1 + acc_n
        time += g * dc + cost(g + 1)
    return asks / steps, tokens / time


for c2, dc in ((1.15, 0.05), (1.45, 0.05)):
    for acc in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        old = run(acc, c2, dc, probe_limit=8, explore=0)
        new = run(acc, c2, dc)
        print(
            f"c2 {c2} acc {acc}: old asks/step {old[0]:.3f} rate {old[1]:.3f}   new asks/step {new[0]:.3f} rate {new[1]:.3f}"
        )
