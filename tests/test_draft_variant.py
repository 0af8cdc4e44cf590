"""benchmarks/experiments/draft_variant.py: a draft model's file with 3-bit matrices (in Q4_0's layout) or fewer
layers, which the quantized model loads as it loads the original."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"benchmarks_{name}", ROOT / "benchmarks" / "experiments" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = module
    spec.loader.exec_module(module)
    return module


draft_variant = _script("draft_variant")
random_gguf = _script("random_gguf")
TINY = random_gguf.Shape("tiny-qwen2", hidden=256, layers=3, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=320)


def _levels(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = packed.reshape(-1, 18)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    low, high = blocks[:, 2:] & 0x0F, blocks[:, 2:] >> 4
    return np.concatenate([low, high], axis=1).astype(np.int32) - 8, scales


def test_3bit_blocks_hold_eight_levels_and_beat_the_plain_scale_rule():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((8, 256)).astype(np.float32)
    packed = draft_variant.quantize_3bit_q4_0(weights)
    assert packed.shape == (8, 256 // 32 * 18)
    levels, scales = _levels(packed)
    assert levels.min() >= -4 and levels.max() <= 3
    back = dequantize(packed, GGMLQuantizationType.Q4_0)
    assert np.array_equal(back.reshape(-1, 32), levels * scales[:, None])  # Q4_0's reading is the 3-bit value
    # the plain rule (largest weight on level -4) is one of the candidates: the chosen scale is never worse
    blocks = weights.reshape(-1, 32)
    largest = blocks[np.arange(len(blocks)), np.argmax(np.abs(blocks), axis=1)]
    d = (largest / -4.0).astype(np.float16).astype(np.float32)
    plain = np.clip(np.rint(blocks / d[:, None]), -4, 3) * d[:, None]
    chosen_err = ((back.reshape(-1, 32) - blocks) ** 2).sum(1)
    assert np.all(chosen_err <= ((plain - blocks) ** 2).sum(1) + 1e-6)
    assert chosen_err.sum() < ((plain - blocks) ** 2).sum()  # and better somewhere
    with pytest.raises(ValueError, match="blocks of 32"):
        draft_variant.quantize_3bit_q4_0(np.zeros((2, 48), dtype=np.float32))


def test_variants_load_in_the_quantized_model(tmp_path):
    import gguf

    from specwise.models.quantized import QuantizedModel

    source = tmp_path / "src.gguf"
    reference = tmp_path / "ref.gguf"
    writer = gguf.GGUFWriter(str(reference), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_token_types([gguf.TokenType.NORMAL] * 300)
    writer.add_token_merges(["t 0"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    random_gguf.write_random_gguf(TINY, reference, source, q6k_layers={"attn_v": {0}, "ffn_down": set()})

    three = draft_variant.write_variant(source, tmp_path / "q3.gguf", bits=3)
    assert three["converted_matrices"] == 7 * TINY.layers + 1  # the layers' matrices and the output layer
    reader = gguf.GGUFReader(three["path"])
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.attn_v.weight"].tensor_type.name == "Q4_0"
    assert tensors["output.weight"].tensor_type.name == "Q4_0"
    assert tensors["token_embd.weight"].tensor_type.name == "Q4_K"  # the embedding is kept
    levels, _ = _levels(np.asarray(tensors["blk.1.ffn_up.weight"].data))
    assert levels.min() >= -4 and levels.max() <= 3
    del reader, tensors

    shallow = draft_variant.write_variant(source, tmp_path / "drop.gguf", drop={1})
    reader = gguf.GGUFReader(shallow["path"])
    assert reader.fields["qwen2.block_count"].contents() == 2
    names = {t.name for t in reader.tensors}
    assert "blk.1.ffn_up.weight" in names and "blk.2.ffn_up.weight" not in names
    del reader
    assert not list(tmp_path.glob(".*.tmp"))

    for path, layers in ((three["path"], 3), (shallow["path"], 2)):
        model = QuantizedModel(path, capacity=32, drafting=True)
        assert len(model.layers) == layers
        logits = model.forward([1, 2, 3])
        assert logits.shape[-1] == TINY.vocab and np.isfinite(logits).all()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(Path(source).read_bytes()[:5000])
    with pytest.raises(ValueError, match="truncated.gguf"):
        draft_variant.write_variant(truncated, tmp_path / "t3.gguf", bits=3)
    assert draft_variant.main(["--source", str(truncated), "--bits", "3", "--out", str(tmp_path / "t.gguf")]) == 2
    with pytest.raises(ValueError, match="cannot drop"):
        draft_variant.write_variant(source, tmp_path / "bad.gguf", drop={3})
    with pytest.raises(ValueError, match="A-B"):
        draft_variant._dropped("3..5")


def test_projection_scales_the_named_drafters_draft_time_and_pairs_by_prompt_and_round():
    def run(config, prompt, rnd, total, draft=0.0):
        return {
            "config": config,
            "prompt_id": prompt,
            "round": rnd,
            "stats": {"total_seconds": total, "draft_seconds": draft},
        }

    results = {
        "command": "specwise bench ...",
        "configurations": [
            {"id": "specwise:none", "label": "plain", "drafter": "none"},
            {"id": "a", "label": "base", "drafter": "model:base.gguf"},
            {"id": "b", "label": "three", "drafter": "model:x-q3levels.gguf"},
        ],
        "runs": [
            run("specwise:none", "p", 0, 10.0),
            run("specwise:none", "p", 1, 10.0),
            run("specwise:none", "q", 0, 8.0),
            run("a", "p", 0, 5.0, 2.0),
            run("a", "p", 1, 5.0, 2.0),
            run("a", "q", 0, 4.0, 2.0),
            run("b", "p", 0, 5.0, 1.8),
            run("b", "p", 1, 8.0, 1.8),
            run("b", "q", 0, 8.0, 3.6),
            run("b", "r", 0, 1.0, 0.5),  # no plain run of prompt r: left out
        ],
    }
    out = draft_variant.project(results, "q3levels", byte_ratio=0.5)["configurations"]
    assert out["base"]["scaled"] is False
    assert out["base"]["paired_speedup_measured"] == pytest.approx(2.0)
    assert out["base"]["paired_speedup_projected"] == pytest.approx(2.0)
    three = out["three"]
    # prompt p: rounds 10/5 and 10/8 -> sqrt(2 * 1.25); prompt q: 8/8 -> 1; then the mean over prompts
    assert three["paired_speedup_measured"] == pytest.approx(np.sqrt(np.sqrt(2 * 1.25) * 1.0))
    # halved draft time: p 10/4.1 and 10/7.1, q 8/6.2
    assert three["paired_speedup_projected"] == pytest.approx(np.sqrt(np.sqrt(10 / 4.1 * 10 / 7.1) * 8 / 6.2))
    with pytest.raises(ValueError, match="byte-ratio"):
        draft_variant.project(results, "q3levels", byte_ratio=1.5)
    with pytest.raises(ValueError, match="no plain runs"):
        draft_variant.project({**results, "runs": results["runs"][3:]}, "q3levels")
