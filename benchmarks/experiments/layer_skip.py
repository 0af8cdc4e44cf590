"""Does drafting with the target's own layers, some of them skipped, pay on a CPU? (layer skipping without training)

Question: can the target draft for itself by running with a set of its layers skipped (Draft & Verify / SWIFT style,
no training), on a 2-core CPU where a pass costs what it reads? Answer, for Qwen2.5-Coder-1.5B (28 layers): no.
Skipping the 2 layers that change the hidden state least keeps the full model's greedy choice 90% of the time, 4
layers 80%, 8 layers 62%, 14 layers 29% (teacher-forced on the target's own answers to 14 Spec-Bench first turns and 4
code edits); with the draft reading what it keeps (the kept layers and the output layer, or a 32,768-token output
layer), the best modelled speed-up over every gamma is 1.04× (2 layers skipped, narrow output layer), and 0.79–0.96×
with the full output layer, before any overhead. Skipping layers saves too few bytes for the agreement it costs at
this size: a self-draft must read a small share of the weights (a few layers and a narrow output layer) and recover
agreement some other way (a trained adapter). Results: benchmarks/results/self_spec_layer_skip_qwen15/ (study.json,
projection.json; AMD EPYC Zen 4, 2 cores).

Method. Stage 1 (--generate): the target's greedy answers (the native model, q8) to calibration prompts (the project's
shipped prompts and two code edits of the bench's workload) and evaluation prompts (the first turn of one question per
Spec-Bench category from --questions, and four other code edits). Stage 2 (--study): the float32 Hugging Face model
(needs the hf extra) reads prompt and answer in one pass, all layers and with the skipped set; agreement is the share of
answer positions where the two argmaxes match (greedy alpha), and sum(min(p, q)) at T = 0.7. The skipped set for N is
the N layers of least block influence (1 - cosine(layer input, layer output)) measured on the calibration answers
only. Stage 3 (--project): the speed-up E[tokens a step] / (c(gamma + 1) + gamma d), with c(k) the target's pass-cost
curve measured by `specwise profile` and d the draft pass's share of the bytes a full pass reads.

    python benchmarks/experiments/layer_skip.py --target …/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf \\
        --questions question.jsonl --out benchmarks/results/self_spec_layer_skip_qwen15 --generate --study --project \\
        --profile benchmarks/results/self_spec_layer_skip_qwen15/profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

TRIMMED_VOCAB = 32768


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="a GGUF file")
    ap.add_argument("--questions", default=os.environ.get("SPECWISE_QUESTIONS"), help="Spec-Bench question.jsonl")
    ap.add_argument("--out", required=True, help="a folder: answers.json, study.json, projection.json")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--study", action="store_true")
    ap.add_argument("--project", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--skips", default="2,4,6,8,10,12,14")
    ap.add_argument("--profile", help="--project: the target's cost curve, as `specwise profile --json` prints it")
    return ap.parse_args(argv)


def prompts(questions: str | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    from specwise.lab.answers import SHIPPED_PROMPTS
    from specwise.lab.bench.workloads import DATA_DIR

    def read(name: str) -> list[str]:
        return [json.loads(line)["prompt"] for line in (SHIPPED_PROMPTS / name).read_text().splitlines() if line]

    edits = [json.loads(line) for line in (DATA_DIR / "code_edit.jsonl").read_text().splitlines() if line]
    edit = [f"{e['instruction']}\n\n```python\n{e['original']}\n```" for e in edits]
    calib = [("calib", p) for p in read("mbpp.prompts.jsonl")[:4] + read("oasst_en.prompts.jsonl")[:4] + edit[:2]]
    evaluation: dict[str, str] = {}
    if questions:
        for line in Path(questions).read_text().splitlines():
            q = json.loads(line)
            evaluation.setdefault(q["category"], q["turns"][0])
    return calib, list(evaluation.items()) + [("code_edit", e) for e in edit[2:6]]


def generate(args, out: Path) -> None:
    from specwise.runtime import build_runtime, encode_prompt
    from specwise.sampling import SamplingParams

    runtime = build_runtime(args.target, "none", 0, "cpu")
    calib, evaluation = prompts(args.questions)
    rows = []
    for kind, text in calib + evaluation:
        ids = encode_prompt(runtime.tokenizer, text, chat=True)
        result = runtime.engine.generate(ids, SamplingParams(temperature=0.0), args.new_tokens)
        rows.append({"set": "calib" if kind == "calib" else "eval", "category": kind, "prompt_ids": ids,
                     "answer_ids": result.token_ids})  # fmt: skip
        print(kind, len(ids), len(result.token_ids), file=sys.stderr, flush=True)
    (out / "answers.json").write_text(json.dumps(rows))


def study(args, out: Path) -> None:
    import torch

    from specwise.lab.bench.environment import script_header
    from specwise.models import load_model

    hf = load_model(args.target, impl="hf").hf_model
    rows = json.loads((out / "answers.json").read_text())
    layers, count = hf.model.layers, len(hf.model.layers)

    def run(row, keep=None, hidden=False):
        ids = torch.tensor([row["prompt_ids"] + row["answer_ids"]])
        if keep is not None:
            hf.model.layers, hf.config.num_hidden_layers = torch.nn.ModuleList([layers[i] for i in keep]), len(keep)
        try:
            with torch.no_grad():
                o = hf(ids, use_cache=False, output_hidden_states=hidden)
        finally:
            hf.model.layers, hf.config.num_hidden_layers = layers, count
        n, a = len(row["prompt_ids"]), len(row["answer_ids"])
        return o.logits[0, n - 1 : n - 1 + a].float(), (o.hidden_states if hidden else None)

    full, influence = {}, np.zeros(count)
    for i, row in enumerate(rows):
        logits, states = run(row, hidden=row["set"] == "calib")
        full[i] = logits
        if states is not None:
            n = len(row["prompt_ids"])
            for layer in range(count):
                cos = torch.nn.functional.cosine_similarity(states[layer][0, n:], states[layer + 1][0, n:], dim=-1)
                influence[layer] += float((1 - cos).mean())
    order = [int(x) for x in np.argsort(influence)]

    def agreement(keep, which):
        greedy, mass, n = 0, 0.0, 0
        for i, row in enumerate(rows):
            if row["set"] == which:
                logits, _ = run(row, keep)
                p, q = torch.softmax(full[i] / 0.7, -1), torch.softmax(logits / 0.7, -1)
                greedy += int((logits.argmax(-1) == full[i].argmax(-1)).sum())
                mass += float(torch.minimum(p, q).sum())
                n += logits.shape[0]
        return greedy / n, mass / n

    result = {**script_header(None), "target": args.target, "layers": count, "order": order, "skips": [],
              "block_influence": influence.tolist()}  # fmt: skip
    for n_skip in [int(x) for x in args.skips.split(",")]:
        keep = [layer for layer in range(count) if layer not in set(order[:n_skip])]
        cg, cs = agreement(keep, "calib")
        eg, es = agreement(keep, "eval")
        result["skips"].append({"n": n_skip, "skipped": sorted(order[:n_skip]), "calib_greedy": cg, "calib_t07": cs,
                                "eval_greedy": eg, "eval_t07": es})  # fmt: skip
        print(n_skip, f"greedy {eg:.3f}, T=0.7 {es:.3f}", file=sys.stderr, flush=True)
        (out / "study.json").write_text(json.dumps(result, indent=1))


def project(args, out: Path) -> None:
    """The modelled speed-up per skipped count and output layer, at the best gamma."""
    result = json.loads((out / "study.json").read_text())
    curve = {int(k): float(v) for k, v in json.loads(Path(args.profile).read_text())["cost_curve"].items()}
    sizes = tensor_mib(args.target)
    layers_mib = sum(v for k, v in sizes.items() if k.startswith("blk."))
    output_mib = sizes.get("output.weight", sizes["token_embd.weight"])
    trimmed_mib = output_mib * TRIMMED_VOCAB / vocab_size(args.target)
    full = layers_mib + output_mib
    rows = []
    for s in result["skips"]:
        for label, out_mib in (("full output layer", output_mib), (f"{TRIMMED_VOCAB}-token output layer", trimmed_mib)):
            d = ((result["layers"] - s["n"]) / result["layers"] * layers_mib + out_mib) / full
            for key in ("eval_greedy", "eval_t07"):
                a, best = s[key], (0.0, 0)
                for g in range(1, 9):
                    e = (1 - a ** (g + 1)) / (1 - a)
                    best = max(best, (e / (curve[g + 1] + g * d), g))
                row = {"skipped": s["n"], "output": label, "alpha_kind": key, "alpha": round(a, 3)}
                rows.append(row | {"draft_cost": round(d, 3), "best_gamma": best[1], "speedup": round(best[0], 3)})
    (out / "projection.json").write_text(json.dumps({"cost_curve": curve, "layers_mib": layers_mib,
                                                     "output_mib": output_mib, "rows": rows}, indent=1))  # fmt: skip
    for row in rows:
        print(row)


def vocab_size(path: str) -> int:
    import gguf

    reader = gguf.GGUFReader(str(Path(path).expanduser()))
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def tensor_mib(path: str) -> dict[str, float]:
    import gguf

    return {t.name: int(t.n_bytes) / 2**20 for t in gguf.GGUFReader(str(Path(path).expanduser())).tensors}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if args.generate:
        generate(args, out)
    if args.study:
        study(args, out)
    if args.project:
        project(args, out)
    print(f"{time.time() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
