"""The 7B projection's tools: benchmarks/experiments/random_gguf.py (a random-weight file of a real model's shapes,
loaded by the quantized model) and benchmarks/experiments/project_pair.py (the projection's arithmetic, by
hand-computed cases)."""

from __future__ import annotations

import importlib.util
import json
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
    sys.modules[f"benchmarks_{name}"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


random_gguf = _script("random_gguf")
project_pair = _script("project_pair")

# the 7B's architecture (qwen2: GQA, q/k/v biases, untied output) at a size a test writes in a moment
TINY = random_gguf.Shape("tiny-qwen2", hidden=256, layers=3, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=320)
REFERENCE_TOKENS = 300


def _reference(path: Path) -> Path:
    """A GGUF file holding only a tokenizer (300 tokens, gpt2 model), as a real model's file would."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"t{i}" for i in range(REFERENCE_TOKENS)])
    writer.add_token_types([gguf.TokenType.NORMAL] * REFERENCE_TOKENS)
    writer.add_token_merges(["t 0"])
    writer.add_eos_token_id(7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_random_gguf_has_the_shapes_and_mix_and_the_quantized_model_runs_it(tmp_path):
    import gguf

    from specwise.models.quantized import QuantizedModel

    mix = {"attn_v": {0, 2}, "ffn_down": {1}}
    first = random_gguf.write_random_gguf(TINY, _reference(tmp_path / "ref.gguf"), tmp_path / "a.gguf", q6k_layers=mix)
    # a second file takes its Q6_K layers and tokenizer from the first, as the 7B's come from a real Q4_K_M file
    info = random_gguf.write_random_gguf(TINY, first["path"], tmp_path / "b.gguf", seed=1)
    assert info["q6k_layers"] == {"attn_v": [0, 2], "ffn_down": [1]}
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind

    reader = gguf.GGUFReader(info["path"])
    tensors = {t.name: t for t in reader.tensors}
    expect = {
        "token_embd.weight": ([256, 320], "Q4_K"),
        "output.weight": ([256, 320], "Q6_K"),
        "blk.0.attn_q.weight": ([256, 256], "Q4_K"),
        "blk.0.attn_k.weight": ([256, 128], "Q4_K"),
        "blk.0.attn_v.weight": ([256, 128], "Q6_K"),
        "blk.1.attn_v.weight": ([256, 128], "Q4_K"),
        "blk.1.ffn_down.weight": ([512, 256], "Q6_K"),
        "blk.2.ffn_down.weight": ([512, 256], "Q4_K"),
        "blk.2.ffn_gate.weight": ([256, 512], "Q4_K"),
        "blk.2.attn_output.weight": ([256, 256], "Q4_K"),
        "blk.1.attn_q.bias": ([256], "F32"),
        "blk.1.attn_k.bias": ([128], "F32"),
    }
    for name, (dims, kind) in expect.items():
        assert [int(d) for d in tensors[name].shape] == dims, name
        assert tensors[name].tensor_type.name == kind, name
    assert len(tensors) == 3 + 12 * TINY.layers
    scales = np.asarray(tensors["blk.0.ffn_up.weight"].data).reshape(-1, 144)[:, :4].copy().view(np.float16)
    assert np.isfinite(scales).all() and 0 < np.abs(scales).max() < 1e-2
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == TINY.vocab and tokens[5] == "t5" and tokens[-1] == f"[PAD{TINY.vocab - 1}]"
    kinds = reader.fields["tokenizer.ggml.token_type"].contents()
    assert kinds[REFERENCE_TOKENS - 1] == gguf.TokenType.NORMAL and kinds[REFERENCE_TOKENS] == gguf.TokenType.UNUSED
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == 7
    assert reader.fields["qwen2.attention.head_count_kv"].contents() == 2
    del reader, tensors

    model = QuantizedModel(info["path"], capacity=32)
    assert (model.vocab_size, model.hidden, model.n_heads, model.head_dim) == (320, 256, 4, 64)
    assert model.intermediate == 512 and len(model.layers) == TINY.layers
    logits = model.forward([1, 2, 3, 4])
    assert logits.shape[-1] == TINY.vocab and np.isfinite(logits).all()


def test_random_gguf_refuses_rows_that_are_not_whole_blocks(tmp_path):
    bad = random_gguf.Shape("bad", hidden=200, layers=1, heads=2, kv_heads=1, head_dim=100, ffn=256, vocab=320)
    with pytest.raises(ValueError, match="blocks of 256"):
        random_gguf.tensor_plan(bad, {})


def test_the_7b_plan_is_the_size_of_a_q4_k_m_file():
    """Qwen2.5-7B's shapes in the Q4_K_M mix of the 28-layer reference: ~4.68 GB of tensor data."""
    mix = {r: {0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27} for r in ("attn_v", "ffn_down")}
    plan = random_gguf.tensor_plan(random_gguf.SHAPES["qwen2.5-7b"], mix)
    total = sum(random_gguf._nbytes(dims, kind) for _, dims, kind in plan)
    assert 4.6e9 < total < 4.7e9
    assert sum(kind == "Q6_K" for _, _, kind in plan) == 29  # output + 14 attn_v + 14 ffn_down


def test_acceptance_curve_by_hand():
    # positions 0 and 1 drafted often enough: 80/100, 30/50; position 2 (10 drafts) is extrapolated
    curve, flags = project_pair.acceptance_curve([100, 50, 10], [80, 30, 5], positions=4, min_drafted=20)
    assert curve == pytest.approx([0.8, 0.6, 0.45, 0.3375])  # conditional rate 0.6 / 0.8 = 0.75
    assert flags == [False, False, True, True]
    # a later position more often accepted than an earlier one (noise) is held at the earlier rate
    assert project_pair.acceptance_curve([100, 100], [50, 60], positions=2)[0] == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="min-drafted"):
        project_pair.acceptance_curve([5], [4])
    with pytest.raises(ValueError, match="accepted_by_position"):
        project_pair.acceptance_curve([10, 10], [11, 1])


def test_projection_by_hand():
    passes = {1: 0.10, 2: 0.11, 3: 0.12}
    out = project_pair.project(passes, draft_seconds=0.02, curve=[0.8, 0.6], gammas=[1, 2, 3])
    one, two = out["by_gamma"]
    # gamma 1: 1.8 tokens per (0.02 + 0.11) s; gamma 2: 2.4 tokens per (0.04 + 0.12) s; plain 1 token per 0.10 s
    assert one["expected_tokens_per_step"] == pytest.approx(1.8)
    assert one["speedup"] == pytest.approx(1.8 * 0.10 / 0.13)
    assert two["speedup"] == pytest.approx(1.5)
    assert two["cost_of_step_in_passes"] == pytest.approx(1.6)
    assert out["best"] == {"gamma": 2, "speedup": pytest.approx(1.5), "tokens_per_second": pytest.approx(15.0)}
    assert out["unmeasured"] == [3]  # no pass over 4 tokens was timed
    assert out["draft_cost_in_passes"] == pytest.approx(0.2)


def _summary_row(config, drafted, accepted, speedup, decode_tps):
    stats = {"drafted_by_position": drafted, "accepted_by_position": accepted, "gamma_histogram": {}}
    return {
        "config": config,
        "category": "coding",
        "speedup_vs_plain": speedup,
        "decode_tokens_per_second_median": decode_tps,
        "mean_accepted_length": 1.0,
        "stats": stats,
    }


def test_project_pair_end_to_end_from_files(tmp_path, capsys):
    results = {
        "command": "specwise bench ...",
        "summary": [
            _summary_row("specwise:none", [], [], 1.0, 20.0),
            _summary_row("specwise:model:d.gguf:gauto", [100, 50], [80, 30], 1.3, 26.0),
            _summary_row("specwise:ngram+model:d.gguf:gauto", [100, 50], [90, 40], 1.4, 28.0),
        ],
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    big = {"forward_seconds": {"1": 0.10, "2": 0.11, "3": 0.12}, "drafter": "none"}
    small = {"forward_seconds": {"1": 0.04, "2": 0.042, "3": 0.05}, "drafter": "model:d.gguf"}
    small["drafter_seconds_per_token"] = 0.02
    (tmp_path / "big.json").write_text(json.dumps(big))
    (tmp_path / "small.json").write_text(json.dumps(small))
    args = ["--target-profile", str(tmp_path / "big.json"), "--check-profile", str(tmp_path / "small.json")]
    args += ["--acceptance", str(tmp_path / "results.json"), "--gammas", "1", "2", "--out", str(tmp_path / "o.json")]
    assert project_pair.main(args) == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["inputs"]["acceptance"]["config"] == "specwise:model:d.gguf:gauto"  # the model drafter alone
    assert out["draft_seconds_source"].startswith("drafter_seconds_per_token of")  # the check's draft cost
    assert out["projection"]["best"]["speedup"] == pytest.approx(1.5)  # test_projection_by_hand's case
    check = out["check"]
    # the check: gamma 1: 1.8 * 0.04 / (0.02 + 0.042); gamma 2: 2.4 * 0.04 / (0.04 + 0.05)
    assert check["projection"]["best"]["speedup"] == pytest.approx(max(1.8 * 0.04 / 0.062, 2.4 * 0.04 / 0.09))
    assert check["measured_speedup"] == pytest.approx(26.0 / 20.0)  # decode tokens/s over plain's
    ratio = check["measured_speedup"] / check["projection"]["best"]["speedup"]
    assert out["projection"]["calibrated_best_speedup"] == pytest.approx(1.5 * ratio)
    assert "command" in out and "machine" in out

    # a configuration that names no single run, and profiles without any draft cost, are refused in one line
    assert project_pair.main([*args[:-2], "--config", "model"]) == 2
    assert "exactly one configuration" in capsys.readouterr().err
    no_draft = ["--target-profile", str(tmp_path / "big.json"), "--acceptance", str(tmp_path / "results.json")]
    assert project_pair.main(no_draft) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--drafter model:" in err
