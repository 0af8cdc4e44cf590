"""The Model contract on the Hugging Face adapter and the toy model; loading, its errors, and what it needs
installed (the GGUF path no torch, the float32 path the hf extra)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import needs_hf
from specwise.extras import MissingExtraError
from specwise.models.loader import cache_dir, default_gguf_path, load_model
from specwise.models.toy import ToyModel


def full_logits(model, ids):
    model.reset()
    return model.forward(np.array(ids))


def assert_logits(got, want, tol: float = 1e-5) -> None:
    """Logits as the contract returns them (float32 C-contiguous numpy arrays), within ``tol`` of ``want``."""
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("make", ["hf", "toy"])
def test_rollback_contract(make, request):
    """rollback(n) then forward gives the logits of a cache that never saw the rolled-back tokens."""
    if make == "hf":
        needs_hf()
    model = request.getfixturevalue("tiny_target") if make == "hf" else ToyModel.random(16, seed=0)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    ref = full_logits(model, ids)  # [10, vocab]
    model.reset()
    model.forward(ids[:4])  # a list of ints is token ids too
    model.forward(np.array([7, 7, 7]))  # a draft that gets rejected
    assert model.length == 7
    model.rollback(4)
    assert model.length == 4
    assert_logits(model.forward(np.array(ids[4:])), ref[4:])


def test_forward_num_logits(tiny_target):
    ids = [3, 1, 4, 1, 5]
    ref = full_logits(tiny_target, ids)
    tiny_target.reset()
    none = tiny_target.forward(np.array(ids[:2]), num_logits=0)
    assert none.shape == (0, tiny_target.vocab_size) and none.dtype == np.float32
    last = tiny_target.forward(np.array(ids[2:]), num_logits=1)
    assert_logits(last, ref[-1:])
    assert tiny_target.device == "cpu"  # a plain string


def test_forward_matches_transformers(tiny_target):
    torch = needs_hf()
    ids = [2, 7, 1, 8, 2, 8]
    with torch.no_grad():
        ref = tiny_target.model(torch.tensor([ids])).logits[0].numpy()
    assert_logits(full_logits(tiny_target, ids), ref)


def test_rollback_and_forward_errors(tiny_target):
    tiny_target.reset()
    tiny_target.forward([1, 2, 3])
    with pytest.raises(ValueError, match="cannot roll back"):
        tiny_target.rollback(5)
    with pytest.raises(ValueError, match="cannot roll back"):
        tiny_target.rollback(-1)
    with pytest.raises(ValueError, match="1-D"):
        tiny_target.forward(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="1-D"):
        tiny_target.forward([])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        tiny_target.forward(np.zeros(600, dtype=np.int64))


def test_hf_model_loads_from_a_directory(tmp_path, tiny_target):
    from specwise.models import HFModel

    tiny_target.model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), impl="hf")
    assert isinstance(loaded.model, HFModel)
    assert loaded.tokenizer is None  # no tokenizer saved
    ids = [5, 6, 7]
    assert_logits(full_logits(loaded.model, ids), full_logits(tiny_target, ids))


def test_a_torch_dtype_and_a_dtype_name_load_alike(tmp_path, tiny_target):
    torch = needs_hf()
    tiny_target.model.save_pretrained(tmp_path / "m")
    ids = [5, 6, 7]
    want = full_logits(tiny_target, ids)
    for dtype in (None, "float32", torch.float32):
        assert_logits(full_logits(load_model(str(tmp_path / "m"), dtype=dtype, impl="hf").model, ids), want)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(str(tmp_path / "m"), dtype="float8")


def test_missing_sources_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        load_model(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(ValueError, match="unknown implementation"):
        load_model("default", impl="fast")


def _without_hf(monkeypatch) -> None:
    """torch and transformers as if not installed (None in sys.modules: the import fails, find_spec finds none)."""
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("spec", "kw", "what"),
    [
        ("default", {"impl": "hf"}, "--impl hf"),
        ("default", {"device": "cuda"}, "on cuda"),
        ("default", {"dtype": "float16"}, "in float16"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", {}, "hub id"),
    ],
)
def test_the_float32_path_without_torch_names_the_hf_extra(monkeypatch, tmp_path, spec, kw, what):
    """Everything but the quantized model needs torch and transformers: without them, one line saying what needs
    them and the command that installs them, before anything is read."""
    _without_hf(monkeypatch)
    monkeypatch.setenv("SPECWISE_CACHE", str(tmp_path))  # nothing converted or cached elsewhere
    with pytest.raises(MissingExtraError) as info:
        load_model(spec, **kw)
    message = str(info.value)
    assert "\n" not in message and what in message, message
    assert "torch" in message and "pip install 'specwise[hf]'" in message


def test_a_model_directory_without_torch_names_the_hf_extra(monkeypatch, tmp_path):
    (tmp_path / "m").mkdir()
    _without_hf(monkeypatch)
    with pytest.raises(MissingExtraError, match=r"model directory.*pip install 'specwise\[hf\]'"):
        load_model(str(tmp_path / "m"))


def test_distill_without_torch_names_its_extra(monkeypatch, capsys):
    """`specwise distill` checks its extra before anything runs (and its parser loads no torch)."""
    from specwise.cli import main

    _without_hf(monkeypatch)
    assert main(["distill", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "specwise distill" in err and "pip install 'specwise[distill]'" in err


def _run_alone(code: str) -> str:
    """``code`` run by a fresh interpreter; returns its last line of output."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_the_loader_imports_no_torch():
    code = """
    import sys
    import specwise.models, specwise.models.loader
    from specwise.models import load_model, LoadedModel, DEFAULT_MODEL
    print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """
    assert _run_alone(code) == "[]"


@pytest.mark.slow
def test_the_default_gguf_file_loads_and_runs_without_torch():
    """The default model (a GGUF file on a CPU): the quantized native model and the file's tokenizer, a pass's
    logits as the contract returns them, and no torch or transformers loaded on the way."""
    code = """
    import sys
    import numpy as np
    from specwise.models import load_model
    loaded = load_model("default")
    ids = loaded.tokenizer.encode("The capital of France is")
    logits = loaded.model.forward(np.array(ids, dtype=np.int64), num_logits=1)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert logits.shape == (1, loaded.model.vocab_size)
    assert type(loaded.model).__name__ == "QuantizedModel", type(loaded.model)
    print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """
    assert _run_alone(code) == "[]"


@pytest.mark.slow
def test_a_large_vocabulary_loads_its_tokenizer_before_the_weights_to_the_same_model(monkeypatch, smollm):
    """Above SERIAL_TOKENIZER tokens the tokenizer is read before the weights instead of beside them (a lower
    peak of memory): the loaded model and tokenizer are the same either way."""
    import numpy as np

    from specwise.models import loader

    monkeypatch.setattr(loader, "SERIAL_TOKENIZER", 0)
    serial = loader.load_model("default")
    text = "def f(x):\n    return x  # café 東京"
    ids = smollm.tokenizer.encode(text)
    smollm.model.rollback(0)  # the session's model may hold another test's tokens
    assert serial.tokenizer.encode(text) == ids and serial.tokenizer.decode(ids) == smollm.tokenizer.decode(ids)
    np.testing.assert_array_equal(
        serial.model.forward(np.array(ids, dtype=np.int64), num_logits=1),
        smollm.model.forward(np.array(ids, dtype=np.int64), num_logits=1),
    )
    smollm.model.rollback(0)


@pytest.mark.slow
def test_attention_and_cache_formats_reach_the_quantized_model_from_the_command_line(capsys, smollm):
    """``--kv-cache`` and ``--attention`` reach the target's quantized model (load_model's ``kv_cache`` and
    ``attention``): a float16 cache gives a greedy answer, the float32 default is what the session's model holds;
    asked of any other implementation, or the bfloat16 attention on a path without AVX512_BF16, one line names it."""
    import json

    import numpy as np

    from specwise.cli import main
    from specwise.models import load_model
    from specwise.models.kernels import quant

    assert smollm.model.kv_dtype == np.float32 and smollm.model.attention == "float32"
    assert load_model("default", kv_cache="float16").model.kv_dtype == np.float16
    base = ["generate", "Name a colour.", "--max-new-tokens", "4", "--drafter", "ngram", "--json"]
    assert main([*base, "--kv-cache", "float16"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 4
    with pytest.raises(ValueError, match="kv cache float16: a choice of the quantized native model"):
        load_model("default", impl="hf", kv_cache="float16")
    try:
        quant.set_isa("avx2")
        assert main([*base, "--attention", "bfloat16"]) != 0
        captured = capsys.readouterr()
        assert "AVX512_BF16" in captured.err and "--attention float32" in captured.err
        assert "Traceback" not in captured.err and captured.out == ""
    finally:
        quant.set_isa(None)


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
