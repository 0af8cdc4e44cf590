"""The Model contract on the Hugging Face adapter and the toy model; loading and its errors."""

from __future__ import annotations

import pytest
import torch

from specwise.models import HFModel, load_model
from specwise.models.loader import cache_dir, default_gguf_path
from specwise.models.toy import ToyModel


def full_logits(model, ids):
    model.reset()
    return model.forward(torch.tensor(ids))


@pytest.mark.parametrize("make", ["hf", "toy"])
def test_rollback_contract(make, tiny_target):
    """rollback(n) then forward gives the logits of a cache that never saw the rolled-back tokens."""
    model = tiny_target if make == "hf" else ToyModel.random(16, seed=0)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    ref = full_logits(model, ids)  # [10, vocab]
    model.reset()
    model.forward(torch.tensor(ids[:4]))
    model.forward(torch.tensor([7, 7, 7]))  # a draft that gets rejected
    assert model.length == 7
    model.rollback(4)
    assert model.length == 4
    got = model.forward(torch.tensor(ids[4:]))
    torch.testing.assert_close(got, ref[4:], atol=1e-5, rtol=1e-5)


def test_forward_num_logits(tiny_target):
    ids = [3, 1, 4, 1, 5]
    ref = full_logits(tiny_target, ids)
    tiny_target.reset()
    assert tiny_target.forward(torch.tensor(ids[:2]), num_logits=0).shape == (0, tiny_target.vocab_size)
    last = tiny_target.forward(torch.tensor(ids[2:]), num_logits=1)
    torch.testing.assert_close(last, ref[-1:], atol=1e-5, rtol=1e-5)
    assert last.dtype == torch.float32


def test_forward_matches_transformers(tiny_target):
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    with torch.no_grad():
        ref = tiny_target.model(ids).logits[0]
    torch.testing.assert_close(full_logits(tiny_target, ids[0].tolist()), ref, atol=1e-5, rtol=1e-5)


def test_rollback_and_forward_errors(tiny_target):
    tiny_target.reset()
    tiny_target.forward(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="cannot roll back"):
        tiny_target.rollback(5)
    with pytest.raises(ValueError, match="cannot roll back"):
        tiny_target.rollback(-1)
    with pytest.raises(ValueError, match="1-D"):
        tiny_target.forward(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        tiny_target.forward(torch.zeros(600, dtype=torch.int64))


def test_hf_model_loads_from_a_directory(tmp_path, tiny_target):
    tiny_target.model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), impl="hf")
    assert isinstance(loaded.model, HFModel)
    assert loaded.tokenizer is None  # no tokenizer saved
    ids = [5, 6, 7]
    torch.testing.assert_close(full_logits(loaded.model, ids), full_logits(tiny_target, ids), atol=1e-5, rtol=1e-5)


def test_missing_sources_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_model(str(tmp_path / "no" / "such" / "dir"))


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SPECWISE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "specwise"


def test_default_model_file_is_installed():
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
