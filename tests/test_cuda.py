"""The same results on CUDA as on the CPU: the models, greedy identity, sampled distributions, distillation.

Skipped where CUDA is not available (CI has no GPU) or torch is not installed (the hf extra); `scripts/gpu_check.sh`
runs them on a GPU machine (its `tests` stage; docs/GPU.md). The models take token ids on the CPU and return numpy
logits on the CPU whatever their device (the Model contract).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from conftest import needs_hf, tiny_llama

torch = needs_hf()  # the whole module: torch models on a GPU
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_head import _assert_follows_target, _head  # noqa: E402

from specwise.drafters import ModelDrafter, NgramDrafter, NoDrafter  # noqa: E402
from specwise.drafters.head import HeadDrafter  # noqa: E402
from specwise.engine import Engine  # noqa: E402
from specwise.models import HFModel  # noqa: E402
from specwise.models.native import NativeModel  # noqa: E402
from specwise.sampling import SamplingParams  # noqa: E402

CUDA = "cuda"
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 40, 41, 42, 3, 3]]


@pytest.fixture(autouse=True)
def _exact_float32():
    """Plain float32 products (no TF32), so CUDA and CPU agree to rounding."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def _pair(seed: int, **kw):
    """The same random tiny Llama on the CPU and on CUDA."""
    cpu = tiny_llama(seed=seed, **kw)
    return cpu, copy.deepcopy(cpu).to(CUDA)


def _greedy(engine: Engine, prompt: list[int], n: int = 40) -> list[int]:
    return engine.generate(prompt, GREEDY, max_new_tokens=n, eos_token_ids=[]).token_ids


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_logits_on_cuda_equal_the_cpu(impl):
    cpu, gpu = _pair(1)
    wrap = NativeModel if impl == "native" else HFModel
    a, b = wrap(cpu), wrap(gpu)
    assert isinstance(b.device, str) and b.device.startswith("cuda")
    ids = [1, 5, 9, 2, 44, 17, 3]
    la = np.concatenate([a.forward(np.array(ids[:4])), a.forward(ids[4:])])
    parts = [b.forward(np.array(ids[:4])), b.forward(ids[4:])]
    assert all(isinstance(p, np.ndarray) and p.dtype == np.float32 and p.flags.c_contiguous for p in parts)
    np.testing.assert_allclose(np.concatenate(parts), la, atol=1e-4, rtol=1e-4)
    b.rollback(2)
    np.testing.assert_allclose(b.forward(np.array(ids[2:])), la[2:], atol=1e-4, rtol=1e-4)
    b.keep_features = a.keep_features = True
    a.reset(), b.reset()
    a.forward(ids, 0), b.forward(ids, 0)
    fb = b.features(0, len(ids))
    assert isinstance(fb, np.ndarray) and fb.dtype == np.float32
    np.testing.assert_allclose(fb, a.features(0, len(ids)), atol=1e-4, rtol=1e-4)


def test_greedy_on_cuda_equals_the_cpu_and_every_drafter_keeps_it():
    cpu, gpu = _pair(1)
    _, gpu_draft = _pair(2, layers=1)
    target = NativeModel(gpu)
    head = _head(gpu).to(CUDA)
    for prompt in PROMPTS:
        want = _greedy(Engine(NativeModel(cpu), NoDrafter()), prompt)
        assert _greedy(Engine(target, NoDrafter(CUDA)), prompt) == want
        assert _greedy(Engine(HFModel(gpu), NoDrafter(CUDA)), prompt) == want
        drafters = {
            "model": lambda: ModelDrafter(HFModel(gpu_draft)),
            "twin": lambda: ModelDrafter(NativeModel(copy.deepcopy(gpu))),
            "ngram": lambda: NgramDrafter(device=CUDA),
            "head": lambda: HeadDrafter(head, target),
            "ngram+head": lambda: [NgramDrafter(device=CUDA), HeadDrafter(head, target)],
        }
        for name, make in drafters.items():
            for gamma in (1, 4, "auto"):
                got = _greedy(Engine(target, make(), gamma=gamma), prompt)
                assert got == want, f"{name} at gamma {gamma} changed the greedy output on CUDA"


@pytest.mark.parametrize("drafter_kind", ["model", "head"])
def test_sampled_output_on_cuda_follows_the_target(drafter_kind):
    """Emitted sequences, sampled on CUDA through the engine, follow p computed on the CPU (chi-square)."""
    cpu, gpu = _pair(4, vocab=5, std=0.3)
    target = NativeModel(gpu)
    if drafter_kind == "model":
        _, draft = _pair(5, vocab=5, std=0.3, layers=1)
        drafter = ModelDrafter(HFModel(draft))
    else:
        drafter = HeadDrafter(_head(gpu, torch.tensor([0, 2, 3]), seed=1).to(CUDA), target)
    _assert_follows_target(Engine(target, drafter, gamma=3), cpu, [1, 4], 2000, seed=7000, where=" on CUDA")


@pytest.mark.slow
def test_distill_on_cuda_end_to_end(tmp_path, tiny_dir, capsys):
    """`specwise distill --device cuda`: data, training and report run on the GPU, and the head drafts exactly."""
    from specwise.cli import main

    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name in ("oasst_en", "mbpp", "gsm8k_train"):
        rows = [{"prompt": f"Tell me about {name} number {i}."} for i in range(8)]
        (prompts / f"{name}.prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "head"
    args = ["distill", "--target", tiny_dir, "--out", str(out), "--prompts-dir", str(prompts), "--device", CUDA]
    args += ["--data-dir", str(tmp_path / "data"), "--max-new-tokens", "8", "--gen-batch-size", "4"]
    args += ["--draft-vocab", "512", "--epochs", "2", "--eval-prompts", "2", "--no-progress", "--gsm8k-limit", "4"]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["after"]["positions"] > 0 and report["engine"]["prompts"] == 2
    outputs = {}
    for device in ("cuda", "cpu"):
        gen = ["generate", "hello", "--target", tiny_dir, "--max-new-tokens", "8", "--json", "--device", device]
        for drafter in (f"head:{out}", "none"):
            capsys.readouterr()
            assert main([*gen, "--drafter", drafter]) == 0
            outputs[device, drafter] = json.loads(capsys.readouterr().out)["token_ids"]
    assert len(set(map(tuple, outputs.values()))) == 1, outputs
