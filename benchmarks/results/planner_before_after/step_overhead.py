import time, sys, torch
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams
from specwise.models.loader import load_model
from specwise.engine import Engine
lm = load_model("default")
m = lm.model
orig = m.forward
acc = [0.0, 0]
def fwd(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); acc[0] += time.perf_counter() - t; acc[1] += 1; return r
m.forward = fwd
eng = Engine(m, None, gamma=0, tokenizer=lm.tokenizer)
ids = encode_prompt(lm.tokenizer, "Write a story about a robot who learns to paint.", True)
res = []
for rep in range(5):
    acc[:] = [0.0, 0]
    t = time.perf_counter(); r = eng.generate(ids, SamplingParams(temperature=0), max_new_tokens=128, eos_token_ids=[])
    tot = time.perf_counter() - t
    res.append(((tot-acc[0])/(acc[1]-1)*1000, acc[0]/acc[1]*1000))
print(sys.argv[1], "outside %.3f ms, forward %.3f ms" % (sorted(x[0] for x in res)[2], sorted(x[1] for x in res)[2]))
