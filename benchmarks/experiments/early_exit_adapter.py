"""Can a small trained adapter make the target's first few layers draft for it? (early exit, Kangaroo style)

Question: a self-draft that pays on a memory-bound CPU must read a small share of the weights: the target's first L
layers, a small adapter and an output layer over the tokens the target writes most. Without an adapter the early
exit agrees with the target too rarely (benchmarks/experiments/layer_skip.py). How much of the target's greedy
choice does a trained adapter recover after L layers, and what speed-up would that give? Answer, for the default
model (SmolLM2-135M-Instruct, 30 layers): too little. Trained on the target's own answers to 690 prompts (82,000
answer positions) and measured on 60 held-out shipped prompts, greedy agreement over a 4,096-token output layer after
2 / 4 / 8 layers is 25 / 27 / 28% with a position-wise adapter (1.3 M parameters) and 28 / 28 / 29% with Kangaroo's
kind, causal attention over the shallow states before the MLP (2.7 M parameters); the plain early exit is a few
percent. A draft reading 10-24% of a pass needs about 70% to pay: the modelled best is 1.07× (2 layers, the
4,096-token output layer), and 0.95-1.05× elsewhere. An adapter trains in 1-2 minutes on 2 cores. More data moved
agreement little (an earlier run on 240 prompts, study_240_prompts_full_vocab.json: 29-32% over the full
vocabulary, 43-49% on its own training prompts); at this size the early layers do not carry the next token. Results:
benchmarks/results/self_spec_early_exit_default/study.json (AMD EPYC Zen 4, 2 cores).

For Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 28 layers): too little as well. Trained on its own answers to 480 prompts
(61,000 answer positions; answers made with the 0.5B sibling drafting, the same greedy tokens, in 29 minutes) and
measured on the 60 held-out shipped prompts, greedy agreement over the 4,096-token output layer after 2 / 4 / 8
layers is 28 / 33 / 35% with the position-wise adapter (9.4 M parameters, 2 minutes to train on 2 cores) and
9 / 27 / 27% with the attention adapter (18.9 M parameters, 4-5 minutes); the plain early exit is 1-2%. The
draft's confidence sorts its guesses (after 2 layers: 23% of positions are drafted with probability >= 0.5, and
69% of those agree; >= 0.9: 6% at 88%), but too few are sure: replaying a confidence-stopped draft over the
held-out answers gives 1.13x at best (2 layers, gamma 1, no threshold), the plain model 1.15x, and starting the
verification of drafted tokens at layer L (their shallow keys and values kept) adds under 1%. At a draft share of
0.07-0.08 of a pass, 1.5x needs about 62% agreement. Results: benchmarks/results/self_spec_early_exit_qwen15/
(Intel Xeon, family 6 model 167, AVX-512 with VNNI and AMX, 2 cores; profile.json: its pass-cost curve). With the
shallow state scaled to unit RMS before the adapter (--unit-rms; study_unit_rms.json): 30 / 33 / 35%, 1.17x;
trained 8 epochs (study_unit_rms_8_epochs.json) 32 / 34% after 2 / 4 layers, 1.19x.

For Gemma-3-270M (base, Q4_K_M, 18 layers; answers to the same 540 prompts as raw text, 5 minutes): after 2 / 4 / 8
layers 18 / 20 / 28% position-wise and 20 / 24 / 32% attention, 1.12x at best. Its residual stream is large
(thousands after 2 layers, past float16's range after 8), which an adapter adding to it barely moves: at unit RMS
31 / 37 / 47% (study_unit_rms.json), and trained longer 39 / 42 / 56% (8 epochs) and 43 / 58% after 4 / 8 layers
(20 epochs, 4 minutes each): modelled 1.36x (L = 8, gamma 2; the confidence stop replayed: 1.36x). Results:
benchmarks/results/self_spec_early_exit_gemma270m/ (the same Xeon).

    python benchmarks/experiments/early_exit_adapter.py --target GEMMA.gguf --drafter auto --out DIR --generate \
        --features --prompts P/gsm8k_train.prompts.jsonl P/mbpp.prompts.jsonl P/oasst_en.prompts.jsonl --per-file 80
    python benchmarks/experiments/early_exit_adapter.py --target GEMMA.gguf --out DIR --train --heads 10 --unit-rms \
        --epochs 20 --adapters mlp --layers 4 8 --profile DIR/profile.json

    python benchmarks/experiments/early_exit_adapter.py --target QWEN15.gguf --drafter auto --out DIR --generate \
        --features --prompts P/gsm8k_train.prompts.jsonl P/mbpp.prompts.jsonl P/oasst_en.prompts.jsonl --per-file 80
    specwise profile --target QWEN15.gguf --drafter none --max-k 9 --json > DIR/profile.json
    python benchmarks/experiments/early_exit_adapter.py --target QWEN15.gguf --out DIR --train --heads 12 \
        --profile DIR/profile.json

Method. Stage 1 (--generate): the target's greedy answers (the native model, q8) to the project's shipped prompts;
every fifth prompt is held out. Stage 2 (--features): teacher-forced passes over prompt and answer through the first
L layers (the target's own layers and weights, run by the native kernels as truncated stacks, one after the other)
keep the hidden state after L layers at every answer position, and its label: the target's next greedy token (the
answer itself). Stage 3 (--train, hf extra: torch): per L, an adapter (``--adapters``: ``mlp``, ``h + W2
silu(W1 rmsnorm(h))``, or ``attention``, a causal attention over the sequence's shallow states first; output products
start at zero: the plain early exit) before the target's own final norm and output layer, trained with cross-entropy
over the most frequent answer tokens on the training prompts' answer positions (``--prompts``: more training
prompts beside the shipped ones); reported: the held-out share of positions whose argmax (over all tokens, and over
the N most frequent answer tokens of the training prompts) is the target's token, with and without the adapter, and the
modelled speed-up E[tokens a step] / (c(gamma + 1) + gamma d) at the best gamma, d the draft's share of a 1-token
pass's bytes (L layers, the adapter at 8 bits and an N-token output layer) and c the pass-cost curve (--profile, else
c(k) = 1 + 0.1 (k - 1)); with the verification pass skipping the first L layers for drafted tokens
(``projected_shallow_reuse``); and replayed on the held-out answers with drafting stopped at the first guess below a
confidence threshold (``replayed_confidence_stop``, the best threshold and gamma; the unsure guess's cost counted).

    python benchmarks/experiments/early_exit_adapter.py --target default --out DIR --generate --features --train \
        --prompts P/gsm8k_train.prompts.jsonl P/mbpp.prompts.jsonl P/oasst_en.prompts.jsonl --per-file 150
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

LAYERS = (2, 4, 8)
TOPS = (4096, 8192)


def _jsonl_prompts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:  # lines end at "\n" only (a prompt may hold U+2028)
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def shipped_prompts() -> list[str]:
    folder = Path(__file__).resolve().parents[2] / "specwise" / "shipped" / "prompts"
    out = []
    for path in sorted(folder.glob("*.prompts.jsonl")):
        out += _jsonl_prompts(path)
    return out


def extra_prompts(paths: list[str], per_file: int, exclude: set[str]) -> list[str]:
    """Training prompts beside the shipped ones: the first ``per_file`` of each ``*.prompts.jsonl`` that are not
    shipped prompts (those are held out in part)."""
    out = []
    for path in paths:
        out += [t for t in _jsonl_prompts(Path(path)) if t not in exclude][:per_file]
    return out


def generate(args, out: Path) -> None:
    from specwise.runtime import build_runtime, encode_prompt
    from specwise.sampling import SamplingParams

    # greedy speculative decoding gives the target's own greedy answers, token for token: a drafter only makes
    # this stage faster (for a 1.5B target, its 0.5B sibling)
    runtime = build_runtime(args.target, args.drafter, gamma="auto", precision="q8")
    loaded, engine = runtime.target, runtime.engine
    shipped = shipped_prompts()
    texts = [(text, i % 5 == 0) for i, text in enumerate(shipped)]
    texts += [(text, False) for text in extra_prompts(args.prompts, args.per_file, set(shipped))]
    rows = []
    began = time.perf_counter()
    for i, (text, held_out) in enumerate(texts):
        if loaded.tokenizer.chat_template:
            message = [{"role": "user", "content": text}]
            prompt = loaded.tokenizer.apply_chat_template(message, add_generation_prompt=True)
        else:  # a base model: the prompt as raw text
            prompt = encode_prompt(loaded.tokenizer, text, chat=False)
        answer = engine.generate(list(prompt), SamplingParams(), args.max_new_tokens).token_ids
        rows.append({"index": i, "held_out": held_out, "prompt": list(map(int, prompt)), "answer": answer})
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(texts)} answers, {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} answers in {time.perf_counter() - began:.0f} s", file=sys.stderr)


def features(args, out: Path) -> None:
    from specwise.models import load_model
    from specwise.models.kernels.layers import DecoderStack

    m = load_model(args.target, precision="q8").model
    variant = m._stack.variant  # what the family's layers do beyond Llama's (Gemma 3: norms, windows, GeGLU)
    bounds = [0, *LAYERS]
    stacks = []
    for lo, hi in zip(bounds, bounds[1:]):
        part = None
        if variant is not None:
            lists = ("q_norms", "k_norms", "post_attn_norms", "post_mlp_norms", "windows")
            part = replace(variant, **{f: getattr(variant, f)[lo:hi] for f in lists if getattr(variant, f)})
        stacks.append(
            DecoderStack(
                m.layers[lo:hi], m.attn_norms[lo:hi], m.mlp_norms[lo:hi], m.qkv_biases[lo:hi], m._stack.n_heads,
                m._stack.n_kv, m._stack.head_dim, m._stack.eps, variant=part,
            )
        )  # fmt: skip
    rows = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["answer"]]
    feats = {L: [] for L in LAYERS}
    labels, held, full_argmax, lengths = [], [], [], []
    for row in rows:
        ids = row["prompt"] + row["answer"]
        n = len(ids)
        x = m.embed.rows(np.asarray(ids, dtype=np.int64))
        if variant is not None and variant.embed_scale:
            x *= variant.embed_scale
        cos, sin = m._tables(n + 1)
        local = m._rotary.get("local")  # the windowed layers' own rotary tables, where they have them
        at = slice(len(row["prompt"]) - 1, n - 1)  # the positions whose next token is an answer token
        for (lo, hi), stack in zip(zip(bounds, bounds[1:]), stacks):
            shape = (hi - lo, stack.n_kv, n, stack.head_dim)
            k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            stack.run(x, [(k_cache, v_cache)] * n, list(range(n)), cos, sin, "q8", 2, local=local)
            # every position: an attention adapter reads the prompt too; float16 where it holds the states (Gemma
            # 3's exceed its range: float32, and the concatenation below keeps float32)
            with np.errstate(over="ignore"):
                half = x.astype(np.float16)
            feats[hi].append(half if np.isfinite(half).all() else x.copy())
        label = np.full(n, -1, dtype=np.int64)
        label[at] = row["answer"]
        labels.append(label)
        held.append(np.full(n, row["held_out"]))
        full = np.full(n, -1, dtype=np.int64)
        if row["held_out"]:  # the check of the teacher forcing; a full pass a sequence is slow on a 1.5B target
            full[at] = m.sequence().forward(ids, n)[at].argmax(-1)
        full_argmax.append(full)
        lengths.append(n)
    np.savez(
        out / "features.npz",
        labels=np.concatenate(labels),
        held_out=np.concatenate(held),
        full_argmax=np.concatenate(full_argmax),
        lengths=np.asarray(lengths),
        **{f"h{L}": np.concatenate(feats[L]) for L in LAYERS},
    )
    head = m.lm_head.rows(range(m.vocab_size)).astype(np.float32)
    np.savez(out / "head.npz", head=head, final_norm=np.asarray(m.final_norm, np.float32), eps=m.eps)
    fa, lb = np.concatenate(full_argmax), np.concatenate(labels)
    agree = float((fa[fa >= 0] == lb[fa >= 0]).mean())
    print(f"features of {int((lb >= 0).sum())} answer positions; the full pass agrees with the answers {agree:.3f}")


def _adapter_class():
    import torch

    class Adapter(torch.nn.Module):
        """``x + MLP(norm(x))``, after ``x + Attention(norm(x))`` (causal, over the sequence's shallow states) where
        ``attention``; the output products start at zero (the plain early exit). ``unit``: x is first scaled to
        unit RMS, which leaves the exit's output as it is (the final norm does not see scale) and lets the adapter's
        sums count where the residual stream is large (Gemma 3's)."""

        def __init__(self, hidden: int, heads: int, attention: bool, unit: bool = False) -> None:
            super().__init__()
            self.heads, self.attention, self.unit = heads, attention, unit
            self.g1, self.g2 = torch.nn.Parameter(torch.ones(hidden)), torch.nn.Parameter(torch.ones(hidden))
            if attention:
                self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
                self.o = torch.nn.Linear(hidden, hidden, bias=False)
                torch.nn.init.zeros_(self.o.weight)
            self.w1 = torch.nn.Linear(hidden, 2 * hidden, bias=False)
            self.w2 = torch.nn.Linear(2 * hidden, hidden, bias=False)
            torch.nn.init.zeros_(self.w2.weight)

        @staticmethod
        def _norm(x, g):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g

        def forward(self, x):  # [batch, time, hidden], padded at the end
            if self.unit:
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            if self.attention:
                b, t, h = x.shape
                q, k, v = self.qkv(self._norm(x, self.g1)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
                a = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                )
                x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
            return x + self.w2(torch.nn.functional.silu(self.w1(self._norm(x, self.g2))))

    return Adapter


def train(args, out: Path) -> dict:
    import torch

    torch.manual_seed(0)
    data = np.load(out / "features.npz")
    head_npz = np.load(out / "head.npz")
    norm_w = torch.from_numpy(head_npz["final_norm"])
    eps = float(head_npz["eps"])
    labels_all, held_all = data["labels"], data["held_out"]
    starts = np.concatenate([[0], np.cumsum(data["lengths"])])
    seqs = [slice(a, b) for a, b in zip(starts, starts[1:])]
    train_seqs = [q for q in seqs if not held_all[q.start]]
    held_seqs = [q for q in seqs if held_all[q.start]]
    train_mask = (labels_all >= 0) & ~held_all
    counts = np.bincount(labels_all[train_mask], minlength=head_npz["head"].shape[0])
    order = np.argsort(-counts, kind="stable")
    width = max(TOPS)
    kept = torch.from_numpy(order[:width].copy())  # the output layer of training: the most frequent answer tokens
    place = torch.full((head_npz["head"].shape[0],), -1, dtype=torch.long)
    place[kept] = torch.arange(width)
    head = torch.from_numpy(head_npz["head"])
    narrow = head[kept]
    hidden = head.shape[1]
    Adapter = _adapter_class()

    def logits(h, w):
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_w) @ w.T

    def batches(group, size, shuffle):
        idx = np.random.default_rng(len(group)).permutation(len(group)) if shuffle else np.arange(len(group))
        for i in range(0, len(idx), size):
            part = [group[j] for j in idx[i : i + size]]
            t = max(q.stop - q.start for q in part)
            x = torch.zeros(len(part), t, hidden)
            y = torch.full((len(part), t), -1, dtype=torch.long)
            for r, q in enumerate(part):
                x[r, : q.stop - q.start] = torch.from_numpy(h_all[q].astype(np.float32))
                y[r, : q.stop - q.start] = torch.from_numpy(labels_all[q])
            yield x, y

    def agreement(adapter):
        """The held-out agreement, and per held-out sequence the draft's confidence (its probability of its argmax
        over the 4,096-token output layer) and whether that argmax is the target's token, position by position."""
        hits = {"all": 0, **{f"top{n}": 0 for n in TOPS}}
        total, trace = 0, []
        with torch.no_grad():
            for x, y in batches(held_seqs, 32, False):
                keep = y >= 0
                h = adapter(x)[keep] if adapter is not None else x[keep]
                lg, target = logits(h, head), y[keep]
                hits["all"] += int((lg.argmax(-1) == target).sum())
                for n in TOPS:
                    masked = torch.full_like(lg, -1e30)
                    masked[:, kept[:n]] = lg[:, kept[:n]]
                    hits[f"top{n}"] += int((masked.argmax(-1) == target).sum())
                narrow_probs = torch.softmax(lg[:, kept[: min(TOPS)]], -1)
                conf, pick = narrow_probs.max(-1)
                hit = kept[: min(TOPS)][pick] == target
                rows = keep.sum(1).tolist()
                for c, k in zip(conf.split(rows), hit.split(rows)):
                    trace.append((c.numpy(), k.numpy()))
                total += int(keep.sum())
        return {k: v / total for k, v in hits.items()}, trace

    results = {
        "answer_positions": int((labels_all >= 0).sum()),
        "held_out_positions": int(((labels_all >= 0) & held_all).sum()),
        "train_sequences": len(train_seqs),
        "layers": {},
    }
    traces = {}
    for L in args.layers:
        h_all = data[f"h{L}"]
        row = {"early_exit": agreement(None)[0]}
        for kind in args.adapters:
            torch.manual_seed(0)
            adapter = Adapter(hidden, args.heads, kind == "attention", args.unit_rms)
            opt = torch.optim.AdamW(adapter.parameters(), lr=args.lr, weight_decay=0.01)
            began = time.perf_counter()
            for _ in range(args.epochs):
                for x, y in batches(train_seqs, args.batch, True):
                    target = place[y.clamp(min=0)]
                    keep = (y >= 0) & (target >= 0)
                    loss = torch.nn.functional.cross_entropy(logits(adapter(x)[keep], narrow), target[keep])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            seconds = time.perf_counter() - began
            held_out, trace = agreement(adapter)
            row[kind] = {
                "held_out": held_out,
                "train_seconds": seconds,
                "params": sum(p.numel() for p in adapter.parameters()),
                "confidence": calibration(trace),
            }
            traces[(L, kind)] = trace
            print(L, kind, json.dumps(row[kind]), file=sys.stderr)
        results["layers"][L] = row
    fa = data["full_argmax"]
    results["traces"] = traces  # not written out: project() reads them
    results["full_pass_agreement"] = float((fa[fa >= 0] == labels_all[fa >= 0]).mean())  # held-out positions
    return results


THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def calibration(trace) -> list[dict]:
    """For each confidence threshold: the share of held-out positions whose draft is at least that confident, and
    the agreement among them."""
    conf = np.concatenate([c for c, _ in trace])
    hit = np.concatenate([k for _, k in trace])
    out = []
    for t in THRESHOLDS:
        sure = conf >= t
        out.append(
            {"threshold": t, "share": float(sure.mean()), "agreement": float(hit[sure].mean()) if sure.any() else None}
        )
    return out


def simulate(trace, d: float, curve: dict[int, float], threshold: float, gamma: int) -> float:
    """Speed-up over plain decoding of drafting with confidence stopping, replayed on the held-out answers: a step
    at answer position i drafts while the draft is at least ``threshold`` confident, up to ``gamma`` tokens (none:
    a plain step), keeps the leading drafts that are the target's tokens and one token from the verification pass,
    and costs its drafts (d each, the unsure one that stopped it included) and a pass over drafts + 1 rows.
    Teacher-forced: a draft's confidence is the one it has after the target's own tokens, which past a wrong draft
    decides only when drafting stops."""
    tokens = cost = 0.0
    for conf, hit in trace:
        i, m = 0, len(conf)
        while i < m:
            k = 0
            while k < gamma and i + k < m and conf[i + k] >= threshold:
                k += 1
            a = 0
            while a < k and hit[i + a]:
                a += 1
            unsure = k < gamma and i + k < m  # the draft that stopped drafting was computed too
            tokens += min(a + 1, m - i)
            cost += (k + unsure) * d + curve.get(k + 1, 1 + 0.1 * k)
            i += a + 1
    return tokens / cost


def _speedup(alpha: float, gamma: int, d: float, c: float, shared: float) -> float:
    """E[tokens a step] over a step's cost in 1-token passes: gamma drafts of cost d, and a verification pass of cost
    c whose shallow share ``shared`` the draft already computed for every row but the last."""
    verify = c * (1 - shared) + shared if shared else c
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) / (verify + gamma * d)


def project(results: dict, n_layers: int, layer_bytes: float, head_bytes: float, curve: dict[int, float]) -> None:
    """The modelled speed-up at the best gamma for each L and output-layer width: plain (the verification pass runs
    every layer) and with the draft's shallow keys and values reused (the verification pass starts the drafted
    tokens at layer L: of its c(gamma + 1) it saves the shallow layers' share s for every row but the last draft's)."""
    total = n_layers * layer_bytes + head_bytes
    for L, row in results["layers"].items():
        row["projected"], row["projected_shallow_reuse"] = {}, {}
        kinds = [k for k in ("mlp", "attention") if k in row]
        best = max(kinds, key=lambda k: row[k]["held_out"]["top4096"])
        row["projected_adapter"] = best
        s = int(L) * layer_bytes / total
        for n in TOPS:
            a = row[best]["held_out"][f"top{n}"]
            adapter_bytes = row[best]["params"]  # its weights at 8 bits
            d = (int(L) * layer_bytes + adapter_bytes + head_bytes * n / results["vocab"]) / total
            if n == min(TOPS):  # drafting stops when the draft is unsure, replayed on the held-out answers
                trace = results["traces"][(L, best)]
                top = max(
                    (simulate(trace, d, curve, t, g), t, g) for t in THRESHOLDS for g in range(1, 9)
                )  # fmt: skip
                row["replayed_confidence_stop"] = {"speedup": top[0], "threshold": top[1], "gamma": top[2]}
            for key, reuse in (("projected", False), ("projected_shallow_reuse", True)):
                top = max(
                    (_speedup(a, g, d, curve.get(g + 1, 1 + 0.1 * g), s if reuse else 0.0), g) for g in range(1, 9)
                )
                row[key][f"top{n}"] = {"draft_share": d, "speedup": top[0], "gamma": top[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--out", required=True)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--features", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafter", default="none", help="the drafter spec that speeds up --generate (exact)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="sequences a training step")
    ap.add_argument("--adapters", nargs="+", default=["mlp", "attention"], choices=["mlp", "attention"])
    ap.add_argument("--heads", type=int, default=9, help="the attention adapter's heads")
    ap.add_argument("--prompts", nargs="*", default=[], help="more training prompts (*.prompts.jsonl)")
    ap.add_argument("--per-file", type=int, default=200, help="training prompts taken from each --prompts file")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", nargs="+", type=int, default=list(LAYERS), choices=LAYERS, help="L to train for")
    ap.add_argument("--unit-rms", action="store_true", help="scale the shallow state to unit RMS before the adapter")
    ap.add_argument("--profile", help="a `specwise profile` JSON with the cost curve c(k)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.generate:
        generate(args, out)
    if args.features:
        features(args, out)
    if args.train:
        from specwise.lab.bench.environment import script_header
        from specwise.models import load_model

        results = train(args, out)
        m = load_model(args.target, precision="q8").model
        layer_bytes = sum(w.nbytes for w in m.layers[0])
        results["vocab"] = m.vocab_size
        curve = {}
        if args.profile:
            raw = json.loads(Path(args.profile).read_text())
            curve = {int(k): float(v) for k, v in raw.get("cost_curve", {}).items()}
        project(results, len(m.layers), layer_bytes, m.lm_head.nbytes, curve)
        results.pop("traces")
        report = {**script_header(argv), "target": args.target, "args": vars(args), **results}
        (out / "study.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(json.dumps({L: [r["projected"], r["projected_shallow_reuse"]] for L, r in results["layers"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
