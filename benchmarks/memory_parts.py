"""Where a GGUF model's resident memory goes: each part measured in its own fresh process (Linux /proc).

Stages, each a new interpreter: Python with numpy; importing specwise; the tokenizer alone (as a decode loads it:
from the cache, or a SentencePiece-style vocabulary's compact one built from the file); the weights alone (the
quantized model, tokenizer not read); and the whole of what a user runs, ``load_model`` then decoding
``--new-tokens`` tokens. For each: resident memory now and at its peak
(VmRSS, VmHWM), anonymous and file-backed. The parts are the differences between stages; the goal (peak
resident memory at most twice the file) is checked against the whole. Where torch is installed, what importing it
adds is measured beside (``torch_import_mib``: the core never imports it).

    python benchmarks/memory_parts.py --target ~/.cache/specwise/gguf/gemma-3-270m-Q4_K_M.gguf \
        --out benchmarks/results/memory_parts_gemma3_270m.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from specwise.lab.bench.runner import emit_json, script_header

_PROBE = """
import json, sys
def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mb = lambda key: int(fields[key].split()[0]) / 1024
    return {"now_mb": mb("VmRSS"), "peak_mb": mb("VmHWM"), "anon_mb": mb("RssAnon"), "file_mb": mb("RssFile")}
"""

STAGES = {
    "python_numpy": "import numpy",
    "specwise": "import numpy, specwise.models.quantized, specwise.engine",
    "tokenizer": (
        "import numpy, specwise.models.quantized, specwise.engine\n"
        "from pathlib import Path\nfrom specwise.models.loader import gguf_tokenizer, release_free_memory\n"
        "tokenizer = gguf_tokenizer(Path(TARGET))\nrelease_free_memory()"
    ),
    "weights": (
        "import numpy, specwise.engine\nfrom specwise.models.quantized import QuantizedModel, checked_file\n"
        "from specwise.models.loader import release_free_memory\n"
        "model = QuantizedModel(TARGET, precision='q8', meta=checked_file(TARGET))\nrelease_free_memory()"
    ),
    "load_and_decode": (
        "from specwise.models import load_model\nloaded = load_model(TARGET, precision='q8')\n"
        "model = loaded.model\nmodel.forward(loaded.tokenizer.encode('The capital of France is'))\n"
        "token = 0\nfor _ in range(NEW_TOKENS):\n"
        "    token = int(model.forward([token], 1)[0].argmax())"
    ),
}
TORCH = "import numpy, torch"  # a reference where torch is installed (the hf extra): what importing it would add


def measure(stage: str, target: Path, new_tokens: int) -> dict:
    """One stage in a fresh interpreter: its resident memory at the end, and at its peak."""
    code = (
        _PROBE
        + f"TARGET = {str(target)!r}\nNEW_TOKENS = {new_tokens}\n"
        + (TORCH if stage == "torch" else STAGES[stage])
        + "\nprint(json.dumps(rss()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True, help="a .gguf file the quantized model runs")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="each stage's median over this many processes")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    stages = {}
    names = list(STAGES) + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    for stage in names:
        runs = [measure(stage, args.target, args.new_tokens) for _ in range(args.rounds)]
        stages[stage] = {key: sorted(run[key] for run in runs)[len(runs) // 2] for key in runs[0]}
    file_mb = args.target.stat().st_size / 2**20
    base = stages["specwise"]["now_mb"]
    parts = {
        "python_numpy": stages["python_numpy"]["now_mb"],
        "specwise_import": base - stages["python_numpy"]["now_mb"],
        "tokenizer": stages["tokenizer"]["now_mb"] - base,
        "weights": stages["weights"]["now_mb"] - base,
        "peak_over_end_of_run": stages["load_and_decode"]["peak_mb"] - stages["load_and_decode"]["now_mb"],
    }
    peak = stages["load_and_decode"]["peak_mb"]
    torch_mb = stages["torch"]["now_mb"] - stages["python_numpy"]["now_mb"] if "torch" in stages else None
    emit_json(
        {
            **script_header(argv),
            "target": str(args.target),
            "file_mib": file_mb,
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "stages_mib": stages,
            "parts_mib": parts,
            "peak_mib": peak,
            "peak_over_file": peak / file_mb,
            "goal_peak_mib": 2 * file_mb,
            "torch_import_mib": torch_mb,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
