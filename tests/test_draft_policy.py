"""benchmarks/experiments/draft_policy.py: replaying drafting rules on the draft model's agreement and probabilities,
checked against hand-computed steps (how far a better rule for when to stop drafting could go)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from conftest import needs_hf  # noqa: E402

needs_hf()  # the script measures torch-side drafting
spec = importlib.util.spec_from_file_location(
    "benchmarks_draft_policy", ROOT / "benchmarks" / "experiments" / "draft_policy.py"
)
draft_policy = importlib.util.module_from_spec(spec)
sys.modules["benchmarks_draft_policy"] = draft_policy
spec.loader.exec_module(draft_policy)

# one answer of 4 tokens: the draft agrees at positions 0, 1 and 3, with these probabilities of its choices
ANSWER = ([True, True, False, True], [0.9, 0.8, 0.5, 0.9])
PASSES = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}
DRAFT = 0.2


def speedup(rule, level=0.0, go=1.0):
    return draft_policy.replay([ANSWER], PASSES, DRAFT, rule, level, go=go)


def test_oracle_drafts_exactly_the_accepted_tokens():
    # step 1: 2 drafts (2 passes) and t(3): 3 tokens; step 2 at the last position: a plain pass, 1 token
    out = speedup("oracle")
    assert (out["steps"], out["drafted"], out["accepted"]) == (2, 2, 2)
    assert out["speedup"] == pytest.approx(4 * 1.0 / (2 * DRAFT + 1.2 + 1.0))


def test_fixed_gamma_pays_for_the_rejected_draft():
    assert speedup("fixed", 2)["speedup"] == pytest.approx(4 / (2 * DRAFT + 1.2 + 1.0))
    three = speedup("fixed", 3)  # 3 drafts, t(4), the third rejected
    assert (three["drafted"], three["accepted"]) == (3, 2)
    assert three["speedup"] == pytest.approx(4 / (3 * DRAFT + 1.3 + 1.0))


def test_product_rule_spends_the_pass_that_shows_the_cut_token():
    # level 0.5: 0.9, 0.72 kept, 0.36 cut after its pass: 3 passes, t(3); then at the last position one pass, t(1)
    out = speedup("product", 0.5)
    assert (out["drafted"], out["accepted"]) == (2, 2)
    assert out["speedup"] == pytest.approx(4 / (3 * DRAFT + 1.2 + DRAFT + 1.0))


def test_ahead_rule_saves_the_pass_when_the_guess_says_the_next_token_would_be_cut():
    # go 0.7: 0.72 * 0.7 = 0.504 clears 0.5, so the pass is spent as the product rule spends it
    assert speedup("ahead", 0.5, go=0.7)["speedup"] == pytest.approx(speedup("product", 0.5)["speedup"])
    # go 0.6: 0.72 * 0.6 = 0.432 does not: 2 passes for the same 2 tokens
    assert speedup("ahead", 0.5, go=0.6)["speedup"] == pytest.approx(4 / (2 * DRAFT + 1.2 + DRAFT + 1.0))
    with pytest.raises(ValueError, match="unknown rule"):
        speedup("guess")
