"""`specwise profile`: the cost curve, the saved profile, and the loader applying it."""

from __future__ import annotations

import json

import pytest

from specwise.artifacts import load_profile, profile_path, save_profile
from specwise.cli import main
from specwise.models import load_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_profile_measures_cost_curve_and_saves_it(capsys, cache, tiny_dir):
    code = main(["profile", "--target", tiny_dir, "--drafter", "ngram", "--max-k", "4", "--repeats", "2", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["cost_curve"]) == {"1", "2", "3", "4"}
    assert data["cost_curve"]["1"] == 1.0
    assert all(v > 0 for v in data["forward_seconds"].values())
    assert data["implementation"] == "NativeModel"
    assert set(data["gemm"]) == {"1", "2", "3", "4"} and set(data["gemm"].values()) <= {"torch", "kernel"}
    assert data["drafter_seconds_per_token"] > 0
    saved = load_profile(tiny_dir, "cpu")
    assert saved == data
    assert profile_path(tiny_dir, "cpu").is_relative_to(cache)


def test_profile_rejects_bad_max_k(capsys, cache, tiny_dir):
    assert main(["profile", "--target", tiny_dir, "--max-k", "0"]) == 2
    assert "--max-k must be in 1..32" in capsys.readouterr().err


def test_profile_measures_after_the_given_context(capsys, cache, tiny_dir):
    args = ["profile", "--target", tiny_dir, "--drafter", "none", "--max-k", "2", "--repeats", "1", "--json"]
    assert main([*args, "--context", "40"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 40
    assert main([*args, "--context", "600"]) == 2  # the tiny model holds 512 positions
    assert "lower --context" in capsys.readouterr().err
    assert main([*args, "--context", "0"]) == 2
    assert "--context must be >= 1" in capsys.readouterr().err
    assert main([*args, "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_cost_curve_interleaves_the_passes_and_takes_the_median(monkeypatch):
    """One untimed sweep over k, then every sweep times every k once in alternating order, so that the machine's
    drift hits all k alike; passes disturbed by the machine (here two sweeps 10x slower) are dropped by the median."""
    from specwise.lab import profile

    class Model:
        vocab_size, device, max_length = 50, "cpu", None

        def reset(self):
            pass

        def forward(self, ids, num_logits=None):
            pass

    calls: list[int] = []

    def fake_pass(model, ids, context, k):
        calls.append(k)
        sweep = (len(calls) - 1) // 3  # sweep 0 is the warm-up
        return (10.0 if sweep in (2, 4) else 1.0) * (1.0 + 0.1 * (k - 1))

    monkeypatch.setattr(profile, "_timed_forward", fake_pass)
    curve = profile.cost_curve(Model(), max_k=3, repeats=5, context=8)
    assert calls == [1, 2, 3] + [1, 2, 3, 3, 2, 1] * 2 + [1, 2, 3]
    assert curve == pytest.approx({1: 1.0, 2: 1.1, 3: 1.2})
    with pytest.raises(ValueError, match="repeats"):
        profile.cost_curve(Model(), max_k=3, repeats=0)


def test_loader_applies_the_saved_backend_choice(cache, tiny_dir):
    from specwise.models.native import NativeModel

    save_profile(profile_path(tiny_dir, "cpu"), {"gemm": {"1": "torch", "2": "torch", "3": "torch"}})
    model = load_model(tiny_dir).model
    assert isinstance(model, NativeModel)
    assert model.gemm == ({1: "torch", 2: "torch", 3: "torch"}, "torch")


def test_loader_ignores_a_broken_profile(cache, tiny_dir):
    from specwise.models.native import NativeModel

    path = profile_path(tiny_dir, "cpu")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert isinstance(load_model(tiny_dir).model, NativeModel)
    save_profile(path, {"gemm": {"1": "warp-drive"}})
    assert isinstance(load_model(tiny_dir).model, NativeModel)


def test_cost_curve_and_drafter_cost_on_a_gguf_model(tmp_path):
    """The core path: a quantized model's cost curve from random ids (numpy), and a draft model's cost."""
    from gguf_raw import tiny_model

    from specwise.drafters import ModelDrafter, NgramDrafter
    from specwise.lab import profile
    from specwise.models.kernels import quant

    if not quant.quantized_available():
        pytest.skip("the native quantized kernels are not built")
    from specwise.models.quantized import QuantizedModel

    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_model().bytes())
    model = QuantizedModel(path)
    curve = profile.cost_curve(model, max_k=3, repeats=2, context=8)
    assert set(curve) == {1, 2, 3} and all(v > 0 for v in curve.values())
    assert model.length == 0  # reset after measuring
    ids = profile._random_ids(model.vocab_size, 20)
    assert ids.dtype.name == "int64" and ids.min() >= 0 and ids.max() < model.vocab_size
    assert ids.tolist() == profile._random_ids(model.vocab_size, 20).tolist()  # the same ids every run
    assert profile.drafter_cost(ModelDrafter(QuantizedModel(path)), model.vocab_size, k=3, context=16) > 0
    assert profile.drafter_cost(NgramDrafter(), model.vocab_size, context=16) > 0
