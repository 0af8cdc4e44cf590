"""Greedy identity on the real default model (SmolLM2-135M-Instruct): speculative == plain, token for token."""

from __future__ import annotations

import pytest

from conftest import tiny_llama
from specwise.drafters import ModelDrafter, NgramDrafter, NoDrafter
from specwise.engine import Engine
from specwise.models import HFModel, load_model
from specwise.runtime import encode_prompt
from specwise.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "Name three primary colors.",
    "Summarize this: The cat sat on the mat. The cat was happy because the mat was warm and soft.",
    "Write a Python function that reverses a string.",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def smollm_twin():
    """A second copy of the default model, used as its own draft (everything is accepted)."""
    return load_model("default").model


@pytest.fixture(scope="module")
def random_draft(smollm):
    """A tiny random Llama sharing the default model's vocabulary (almost nothing is accepted)."""
    return HFModel(tiny_llama(seed=9, vocab=smollm.model.vocab_size, hidden=32, layers=1))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_identity_on_the_default_model(smollm, smollm_twin, random_draft, prompt):
    ids = encode_prompt(smollm.tokenizer, prompt, chat=True)
    greedy = SamplingParams(temperature=0.0)

    def run(drafter, gamma):
        engine = Engine(smollm.model, drafter, gamma=gamma, tokenizer=smollm.tokenizer)
        return engine.generate(ids, greedy, max_new_tokens=NEW_TOKENS)

    plain = run(NoDrafter(), 0)
    assert len(plain.token_ids) >= 8
    runs = {
        "ngram": run(NgramDrafter(), 4),
        "draft = target": run(ModelDrafter(smollm_twin), 4),
        "random draft": run(ModelDrafter(random_draft), 3),
    }
    for name, spec in runs.items():
        assert spec.token_ids == plain.token_ids, f"{name} changed the greedy output"
        assert spec.text == plain.text
        assert spec.finish_reason == plain.finish_reason
    # the boundary drafters behave as they must
    assert runs["draft = target"].stats.acceptance_rate > 0.9
    assert runs["random draft"].stats.acceptance_rate < 0.2


def test_sampling_on_the_default_model_is_seeded_and_valid(smollm):
    ids = encode_prompt(smollm.tokenizer, PROMPTS[0], chat=True)
    engine = Engine(smollm.model, NgramDrafter(), gamma=4, tokenizer=smollm.tokenizer)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    a = engine.generate(ids, params, max_new_tokens=24)
    b = engine.generate(ids, params, max_new_tokens=24)
    assert a.token_ids == b.token_ids
    assert 1 <= len(a.token_ids) <= 24
