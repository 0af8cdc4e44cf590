"""Shared fixtures: tiny random Hugging Face Llama models and the real default model (slow).

The tiny Hugging Face models need the ``hf`` extra (torch and transformers): on the core install the tests that use
them are skipped with that reason (:func:`needs_hf`).
"""

from __future__ import annotations

import os

import pytest


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist (``make test`` runs the suite in two worker processes) the workers share the cores: each
    worker's native passes, and torch's, use its share of them (one thread each on two cores), and threads waiting
    at a join sleep rather than spin. The environment's own settings win; the tests of the thread count set the counts
    they test. Run before the kernels or torch are loaded (OpenMP reads its settings once)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    share = str(max(1, cores // workers))
    os.environ.setdefault("SPECWISE_NUM_THREADS", share)
    os.environ.setdefault("OMP_NUM_THREADS", share)
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")


_share_the_cores_between_workers()

HF_REASON = "needs the hf extra (torch, transformers): pip install 'specwise[hf]'"

# Data that is not part of the project (Spec-Bench questions, corpora): only through this variable, a directory laid
# out as data/README.md of the development machines says (spec_bench/question.jsonl, prompts/, corpora/). Unset, the
# tests that read it look beside the repository (../shared/data) and skip or narrow what they check when it is absent.
SHARED_DATA_ENV = "SPECWISE_TEST_DATA"


def shared_data(relative: str):
    """The path of ``relative`` under $SPECWISE_TEST_DATA (default: the development machines' data folder beside the
    repository), or None when it is not there."""
    import os
    from pathlib import Path

    root = os.environ.get(SHARED_DATA_ENV) or Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(root) / relative
    return path if path.exists() else None


def needs_hf():
    """Skip the calling test (or module, at import) unless torch and transformers are installed; returns torch."""
    torch = pytest.importorskip("torch", reason=HF_REASON)
    pytest.importorskip("transformers", reason=HF_REASON)
    return torch


def tiny_llama(seed: int, vocab: int = 96, layers: int = 2, hidden: int = 32, std: float = 0.5):
    """A small random LlamaForCausalLM with peaked logits (large init std keeps greedy away from ties)."""
    torch = needs_hf()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=std,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_target():
    needs_hf()
    from specwise.models import HFModel

    return HFModel(tiny_llama(seed=1), name="tiny-target")


@pytest.fixture(scope="session")
def tiny_draft():
    needs_hf()
    from specwise.models import HFModel

    return HFModel(tiny_llama(seed=2, layers=1), name="tiny-draft")


@pytest.fixture(scope="session")
def tiny_target_twin():
    """A second instance of the target's weights (draft = target)."""
    needs_hf()
    from specwise.models import HFModel

    return HFModel(tiny_llama(seed=1), name="tiny-target-twin")


@pytest.fixture(scope="session")
def smollm():
    """The real default model (SmolLM2-135M-Instruct) as it loads by default: the quantized native model."""
    from specwise.models import load_model

    return load_model("default")


@pytest.fixture(scope="session")
def smollm_hf():
    """The default model as the float32 Hugging Face model (the reference), dequantized from the same GGUF."""
    needs_hf()
    from specwise.models import load_model

    return load_model("default", impl="hf")


@pytest.fixture(scope="session")
def smol_tokenizer(request):
    """The default model's tokenizer: from $SPECWISE_TEST_TOKENIZER (a directory) when set, so that a machine
    without the model's package can run the tests that need only the tokenizer, else from the model."""
    import os

    directory = os.environ.get("SPECWISE_TEST_TOKENIZER")
    if directory:
        needs_hf()
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(directory)
    return request.getfixturevalue("smollm").tokenizer


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_tokenizer):
    """A tiny random Llama with the default model's tokenizer (same vocabulary), saved as a directory."""
    path = tmp_path_factory.mktemp("tiny-smol")
    tiny_llama(seed=3, vocab=len(smol_tokenizer), hidden=16, layers=1).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """One thread for a module's tests (native passes, and torch's where it is loaded): the tiny models need no
    more, and two-thread kernels crawl on a shared 2-core machine (use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    from specwise.models import threads

    before = threads._threads
    threads.set_num_threads(1)
    yield
    threads.set_num_threads(before)
