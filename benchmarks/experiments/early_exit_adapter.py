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
c(k) = 1 + 0.1 (k - 1)).

    python benchmarks/experiments/early_exit_adapter.py --target default --out DIR --generate --features --train \
        --prompts P/gsm8k_train.prompts.jsonl P/mbpp.prompts.jsonl P/oasst_en.prompts.jsonl --per-file 150
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
    from specwise.engine import Engine
    from specwise.models import load_model
    from specwise.sampling import SamplingParams

    loaded = load_model(args.target, precision="q8")
    engine = Engine(loaded.model, None, gamma=0, tokenizer=loaded.tokenizer)
    shipped = shipped_prompts()
    texts = [(text, i % 5 == 0) for i, text in enumerate(shipped)]
    texts += [(text, False) for text in extra_prompts(args.prompts, args.per_file, set(shipped))]
    rows = []
    began = time.perf_counter()
    for i, (text, held_out) in enumerate(texts):
        prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        answer = engine.generate(list(prompt), SamplingParams(), args.max_new_tokens).token_ids
        rows.append({"index": i, "held_out": held_out, "prompt": list(map(int, prompt)), "answer": answer})
    (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} answers in {time.perf_counter() - began:.0f} s", file=sys.stderr)


def features(args, out: Path) -> None:
    from specwise.models import load_model
    from specwise.models.kernels.layers import DecoderStack

    m = load_model(args.target, precision="q8").model
    if m._stack.variant is not None:
        raise SystemExit("truncated stacks are built here for Llama-family layers only (no layer variant)")
    bounds = [0, *LAYERS]
    stacks = []
    for lo, hi in zip(bounds, bounds[1:]):
        stacks.append(
            DecoderStack(
                m.layers[lo:hi], m.attn_norms[lo:hi], m.mlp_norms[lo:hi], m.qkv_biases[lo:hi], m._stack.n_heads,
                m._stack.n_kv, m._stack.head_dim, m._stack.eps,
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
        cos, sin = m._tables(n + 1)
        at = slice(len(row["prompt"]) - 1, n - 1)  # the positions whose next token is an answer token
        for (lo, hi), stack in zip(zip(bounds, bounds[1:]), stacks):
            shape = (hi - lo, stack.n_kv, n, stack.head_dim)
            k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            stack.run(x, [(k_cache, v_cache)] * n, list(range(n)), cos, sin, "q8", 2)
            feats[hi].append(x.astype(np.float16))  # every position: an attention adapter reads the prompt too
        label = np.full(n, -1, dtype=np.int64)
        label[at] = row["answer"]
        labels.append(label)
        held.append(np.full(n, row["held_out"]))
        full = np.full(n, -1, dtype=np.int64)
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
    agree = float((fa[lb >= 0] == lb[lb >= 0]).mean())
    print(f"features of {int((lb >= 0).sum())} answer positions; the full pass agrees with the answers {agree:.3f}")


def _adapter_class():
    import torch

    class Adapter(torch.nn.Module):
        """``x + MLP(norm(x))``, after ``x + Attention(norm(x))`` (causal, over the sequence's shallow states) where
        ``attention``; the output products start at zero (the plain early exit)."""

        def __init__(self, hidden: int, heads: int, attention: bool) -> None:
            super().__init__()
            self.heads, self.attention = heads, attention
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
        hits = {"all": 0, **{f"top{n}": 0 for n in TOPS}}
        total = 0
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
                total += int(keep.sum())
        return {k: v / total for k, v in hits.items()}

    results = {
        "answer_positions": int((labels_all >= 0).sum()),
        "held_out_positions": int(((labels_all >= 0) & held_all).sum()),
        "train_sequences": len(train_seqs),
        "layers": {},
    }
    for L in LAYERS:
        h_all = data[f"h{L}"]
        row = {"early_exit": agreement(None)}
        for kind in args.adapters:
            torch.manual_seed(0)
            adapter = Adapter(hidden, args.heads, kind == "attention")
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
            row[kind] = {
                "held_out": agreement(adapter),
                "train_seconds": time.perf_counter() - began,
                "params": sum(p.numel() for p in adapter.parameters()),
            }
            print(L, kind, json.dumps(row[kind]), file=sys.stderr)
        results["layers"][L] = row
    fa = data["full_argmax"]
    results["full_pass_agreement"] = float((fa[labels_all >= 0] == labels_all[labels_all >= 0]).mean())
    return results


def project(results: dict, n_layers: int, layer_bytes: float, head_bytes: float, curve: dict[int, float]) -> None:
    """The modelled speed-up at the best gamma for each L and output-layer width."""
    total = n_layers * layer_bytes + head_bytes
    for L, row in results["layers"].items():
        row["projected"] = {}
        kinds = [k for k in ("mlp", "attention") if k in row]
        best = max(kinds, key=lambda k: row[k]["held_out"]["top4096"])
        row["projected_adapter"] = best
        for n in TOPS:
            a = row[best]["held_out"][f"top{n}"]
            adapter_bytes = row[best]["params"]  # its weights at 8 bits
            d = (int(L) * layer_bytes + adapter_bytes + head_bytes * n / results["vocab"]) / total
            top = max(((1 - a ** (g + 1)) / (1 - a) / (curve.get(g + 1, 1 + 0.1 * g) + g * d), g) for g in range(1, 9))
            row["projected"][f"top{n}"] = {"draft_share": d, "speedup": top[0], "gamma": top[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--out", required=True)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--features", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="sequences a training step")
    ap.add_argument("--adapters", nargs="+", default=["mlp", "attention"], choices=["mlp", "attention"])
    ap.add_argument("--heads", type=int, default=9, help="the attention adapter's heads")
    ap.add_argument("--prompts", nargs="*", default=[], help="more training prompts (*.prompts.jsonl)")
    ap.add_argument("--per-file", type=int, default=200, help="training prompts taken from each --prompts file")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--profile", help="a `specwise profile` JSON with the cost curve c(k)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.generate:
        generate(args, out)
    if args.features:
        features(args, out)
    if args.train:
        from specwise.bench.environment import script_header
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
        report = {**script_header(argv), "target": args.target, "args": vars(args), **results}
        (out / "study.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(json.dumps({L: r["projected"] for L, r in results["layers"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
