"""Can a small trained adapter make the target's first few layers draft for it? (early exit, Kangaroo style)

Question: a self-draft that pays on a memory-bound CPU must read a small share of the weights: the target's first L
layers, a small adapter and an output layer over the tokens the target writes most. Without an adapter the early
exit agrees with the target too rarely (benchmarks/experiments/layer_skip.py). How much of the target's greedy
choice does a trained adapter recover after L layers, and what speed-up would that give? Answer, for the default
model (SmolLM2-135M-Instruct, 30 layers): too little for a position-wise adapter. After 2 / 4 / 6 / 8 layers the
plain early exit keeps the target's greedy choice 5% of the time; a trained adapter of 1.3 M parameters raises it to
29 / 30 / 30 / 32% on held-out prompts (43-49% on its training prompts: 28,000 positions are too few), where a draft
reading 12-24% of a pass needs about 70% to pay. Modelled speed-up at best 1.07× (4 layers, a 4,096-token output
layer). Training takes 2-5 minutes per adapter on 2 cores. Next: an adapter with attention over the shallow states
(Kangaroo's), trained on many more of the target's own tokens, on a larger target whose early layers carry more.
Results: benchmarks/results/self_spec_early_exit_default/study.json (AMD EPYC Zen 4, 2 cores).

Method. Stage 1 (--generate): the target's greedy answers (the native model, q8) to the project's shipped prompts;
every fifth prompt is held out. Stage 2 (--features): teacher-forced passes over prompt and answer through the first
L layers (the target's own layers and weights, run by the native kernels as truncated stacks, one after the other)
keep the hidden state after L layers at every answer position, and its label: the target's next greedy token (the
answer itself). Stage 3 (--train, hf extra: torch): per L, an adapter ``h + W2 silu(W1 rmsnorm(h))`` (W2 starts at
zero: the plain early exit) before the target's own final norm and output layer, trained with cross-entropy on the
training prompts' positions; reported: the held-out share of positions whose argmax (over all tokens, and over the N
most frequent answer tokens of the training prompts) is the target's token, with and without the adapter, and the
modelled speed-up E[tokens a step] / (c(gamma + 1) + gamma d) at the best gamma, d the draft's share of a 1-token
pass's bytes (L layers, the adapter and an N-token output layer) and c the pass-cost curve (--profile, else
c(k) = 1 + 0.1 (k - 1)). The adapter is position-wise (no attention): what it recovers is a lower bound on
Kangaroo's attention adapter.

    python benchmarks/experiments/early_exit_adapter.py --target default --out DIR --generate --features --train
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

LAYERS = (2, 4, 6, 8)
TOPS = (4096, 8192)


def shipped_prompts() -> list[str]:
    folder = Path(__file__).resolve().parents[2] / "specwise" / "shipped" / "prompts"
    out = []
    for path in sorted(folder.glob("*.prompts.jsonl")):
        out += [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def generate(args, out: Path) -> None:
    from specwise.engine import Engine
    from specwise.models import load_model
    from specwise.sampling import SamplingParams

    loaded = load_model(args.target, precision="q8")
    engine = Engine(loaded.model, None, gamma=0, tokenizer=loaded.tokenizer)
    rows = []
    began = time.perf_counter()
    for i, text in enumerate(shipped_prompts()):
        prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        answer = engine.generate(list(prompt), SamplingParams(), args.max_new_tokens).token_ids
        rows.append({"index": i, "held_out": i % 5 == 0, "prompt": list(map(int, prompt)), "answer": answer})
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
    feats = {L: [] for L in LAYERS}
    labels, held, full_argmax = [], [], []
    for row in rows:
        ids = row["prompt"] + row["answer"]
        n = len(ids)
        if not row["answer"]:
            continue
        x = m.embed.rows(np.asarray(ids, dtype=np.int64))
        cos, sin = m._tables(n + 1)
        at = slice(len(row["prompt"]) - 1, n - 1)  # the positions whose next token is an answer token
        for (lo, hi), stack in zip(zip(bounds, bounds[1:]), stacks):
            shape = (hi - lo, stack.n_kv, n, stack.head_dim)
            k_cache, v_cache = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            stack.run(x, [(k_cache, v_cache)] * n, list(range(n)), cos, sin, "q8", 2)
            feats[hi].append(x[at].copy())
        labels.append(np.asarray(row["answer"], dtype=np.int64))
        held.append(np.full(len(row["answer"]), row["held_out"]))
        seq = m.sequence()
        full_argmax.append(seq.forward(ids, n)[at].argmax(-1))
    np.savez(
        out / "features.npz",
        labels=np.concatenate(labels),
        held_out=np.concatenate(held),
        full_argmax=np.concatenate(full_argmax),
        **{f"h{L}": np.concatenate(feats[L]) for L in LAYERS},
    )
    head = m.lm_head.rows(range(m.vocab_size)).astype(np.float32)
    np.savez(out / "head.npz", head=head, final_norm=np.asarray(m.final_norm, np.float32), eps=m.eps)
    agree = float((np.concatenate(full_argmax) == np.concatenate(labels)).mean())
    print(f"features of {sum(len(x) for x in labels)} positions; the full pass agrees with the answers {agree:.3f}")


def train(args, out: Path) -> dict:
    import torch

    torch.manual_seed(0)
    data = np.load(out / "features.npz")
    head_npz = np.load(out / "head.npz")
    head = torch.from_numpy(head_npz["head"])
    norm_w = torch.from_numpy(head_npz["final_norm"])
    eps = float(head_npz["eps"])
    labels = torch.from_numpy(data["labels"])
    held = torch.from_numpy(data["held_out"])
    counts = np.bincount(data["labels"][~data["held_out"]], minlength=head.shape[0])
    order = np.argsort(-counts, kind="stable")
    tops = {n: torch.from_numpy(np.isin(np.arange(head.shape[0]), order[:n])) for n in TOPS}
    hidden = head.shape[1]

    def logits(h):
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_w
        return h @ head.T

    def agreement(h, mask):
        with torch.no_grad():
            lg = torch.cat([logits(h[i : i + 2048]) for i in range(0, len(h), 2048)])
        out = {"all": float((lg.argmax(-1) == labels[mask]).float().mean())}
        for n, keep in tops.items():
            out[f"top{n}"] = float((lg.masked_fill(~keep, -1e30).argmax(-1) == labels[mask]).float().mean())
        return out

    results = {"positions": int(len(labels)), "held_out_positions": int(held.sum()), "layers": {}}
    for L in LAYERS:
        h = torch.from_numpy(data[f"h{L}"])
        w1 = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        w2 = torch.nn.Linear(2 * hidden, hidden, bias=False)
        torch.nn.init.zeros_(w2.weight)
        g = torch.nn.Parameter(torch.ones(hidden))

        def adapt(x, w1=w1, w2=w2, g=g):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g
            return x + w2(torch.nn.functional.silu(w1(y)))

        params = [*w1.parameters(), *w2.parameters(), g]
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        train_h, train_y = h[~held], labels[~held]
        began = time.perf_counter()
        for _ in range(args.epochs):
            perm = torch.randperm(len(train_h))
            for i in range(0, len(perm), args.batch):
                b = perm[i : i + args.batch]
                loss = torch.nn.functional.cross_entropy(logits(adapt(train_h[b])), train_y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
        seconds = time.perf_counter() - began
        with torch.no_grad():
            adapted = adapt(h[held])
        results["layers"][L] = {
            "early_exit": agreement(h[held], held),
            "adapter": agreement(adapted, held),
            "adapter_train": agreement(adapt(h[~held]).detach(), ~held),
            "train_seconds": seconds,
            "adapter_params": sum(p.numel() for p in params),
        }
        print(L, json.dumps(results["layers"][L]), file=sys.stderr)
    results["full_pass_agreement"] = float((data["full_argmax"] == data["labels"]).mean())
    return results


def project(results: dict, n_layers: int, layer_bytes: float, head_bytes: float, curve: dict[int, float]) -> None:
    """The modelled speed-up at the best gamma for each L and output-layer width."""
    total = n_layers * layer_bytes + head_bytes
    for L, row in results["layers"].items():
        row["projected"] = {}
        for n in TOPS:
            a = row["adapter"][f"top{n}"]
            d = (int(L) * layer_bytes + 3 * (layer_bytes / 12) + head_bytes * n / results["vocab"]) / total
            best = max(((1 - a ** (g + 1)) / (1 - a) / (curve.get(g + 1, 1 + 0.1 * g) + g * d), g) for g in range(1, 9))
            row["projected"][f"top{n}"] = {"draft_share": d, "speedup": best[0], "gamma": best[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--out", required=True)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--features", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
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
