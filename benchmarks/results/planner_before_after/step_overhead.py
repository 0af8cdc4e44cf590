"""Time per plain greedy step outside the target's forward, and the forward itself (median of 5 runs of 128 tokens).

PYTHONPATH=<tree> python step_overhead.py <label>
"""

import sys
import time

from specwise.engine import Engine
from specwise.models.loader import load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams

lm = load_model("default")
model = lm.model
forward = model.forward
spent = [0.0, 0]


def timed_forward(*args, **kwargs):
    t = time.perf_counter()
    out = forward(*args, **kwargs)
    spent[0] += time.perf_counter() - t
    spent[1] += 1
    return out


model.forward = timed_forward
engine = Engine(model, None, gamma=0, tokenizer=lm.tokenizer)
ids = encode_prompt(lm.tokenizer, "Write a story about a robot who learns to paint.", True)
outside, inside = [], []
for _ in range(5):
    spent[:] = [0.0, 0]
    t = time.perf_counter()
    engine.generate(ids, SamplingParams(temperature=0), max_new_tokens=128, eos_token_ids=[])
    total = time.perf_counter() - t
    outside.append((total - spent[0]) / (spent[1] - 1) * 1000)
    inside.append(spent[0] / spent[1] * 1000)
print(f"{sys.argv[1]}: outside {sorted(outside)[2]:.3f} ms, forward {sorted(inside)[2]:.3f} ms")
