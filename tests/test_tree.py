"""Draft trees: the target scores a chain and its alternatives in one pass, and greedy output stays exact."""

from __future__ import annotations

import random

import pytest
import torch
from test_head import _head

from conftest import tiny_llama
from specwise.drafters import Draft, Drafter, NoDrafter
from specwise.drafters.head import HeadDrafter
from specwise.engine import Engine
from specwise.models import HFModel
from specwise.models.native import NativeModel
from specwise.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def _native(hf, backend: str) -> NativeModel:
    model = NativeModel(hf)
    if backend == "torch":
        model.set_gemm(default="torch")
    elif not model.kernel_usable:
        pytest.skip("the native kernels are not available here")
    return model


def _path(parents: list[int], row: int) -> list[int]:
    rows = [row]
    while parents[rows[-1]] >= 0:
        rows.append(parents[rows[-1]])
    return rows[::-1]


@pytest.mark.parametrize("backend", ["kernel", "torch"])
def test_tree_rows_equal_their_paths_fed_as_chains(backend):
    hf = tiny_llama(seed=1)
    model, reference = _native(hf, backend), _native(hf, backend)
    prefix = [3, 17, 5, 40, 2]
    parents = [-1, 0, 1, 0, 3, 2, 0, 1, 4]
    tokens = [9, 11, 30, 12, 8, 55, 60, 71, 13]
    model.forward(torch.tensor(prefix))
    logits = model.forward_tree(torch.tensor(tokens), parents)
    assert model.length == len(prefix) + len(tokens)
    for row in range(len(tokens)):
        reference.rollback(0)
        path = [tokens[r] for r in _path(parents, row)]
        want = reference.forward(torch.tensor(prefix + path))[-1]
        torch.testing.assert_close(logits[row], want, atol=1e-4, rtol=1e-4)
    # keep the branch 0 -> 3 -> 4 -> 8, then continue: the same as that branch fed as a chain
    model.keep_path(len(prefix), [0, 3, 4, 8])
    assert model.length == len(prefix) + 4
    after = model.forward(torch.tensor([21, 22]))
    reference.rollback(0)
    want = reference.forward(torch.tensor(prefix + [tokens[r] for r in (0, 3, 4, 8)] + [21, 22]))[-2:]
    torch.testing.assert_close(after, want, atol=1e-4, rtol=1e-4)


def test_tree_arguments_are_checked():
    model = NativeModel(tiny_llama(seed=1))
    model.forward(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="parents"):
        model.forward_tree(torch.tensor([3, 4]), [-1, 1])
    with pytest.raises(ValueError, match="parents"):
        model.forward_tree(torch.tensor([3, 4]), [-1])
    model.forward_tree(torch.tensor([3, 4, 5]), [-1, 0, 0])
    with pytest.raises(ValueError, match="increasing rows from 0"):
        model.keep_path(2, [0, 2, 1])
    assert not HFModel(tiny_llama(seed=1)).supports_tree


class OracleTreeDrafter(Drafter):
    """A chain that is right for a while then wrong, with alternatives that hold the target's choice sometimes."""

    name = "oracle-tree"

    def __init__(self, plain: list[int], prompt_len: int, seed: int = 0) -> None:
        self.plain, self.prompt_len, self.rng = plain, prompt_len, random.Random(seed)

    def propose(self, context, k, params, generator) -> Draft:
        done = len(context) - self.prompt_len
        truth = self.plain[done : done + k]
        good = self.rng.randint(0, len(truth))
        chain = truth[:good] + [(t + 1) % 96 for t in truth[good:]]
        alternatives = []
        for i, t in enumerate(truth):
            alternatives += [(i, (t + 7) % 96)]
            if self.rng.random() < 0.5:
                alternatives.append((i, t if i >= good else (t + 3) % 96))
        return Draft(torch.tensor(chain, dtype=torch.int64), None, alternatives)


@pytest.mark.parametrize("backend", ["kernel", "torch"])
def test_greedy_with_alternatives_equals_plain_and_uses_them(backend):
    hf = tiny_llama(seed=1)
    target = _native(hf, backend)
    for prompt in ([1, 5, 9, 2], [7], [3, 3, 3, 40, 41, 42, 3]):
        plain = Engine(target, NoDrafter()).generate(prompt, GREEDY, max_new_tokens=48, eos_token_ids=[]).token_ids
        engine = Engine(target, OracleTreeDrafter(plain, len(prompt)), gamma=4)
        result = engine.generate(prompt, GREEDY, max_new_tokens=48, eos_token_ids=[])
        assert result.token_ids == plain
        stats = result.stats
        assert stats.alternatives > 0 and stats.alternatives_accepted > 0
        assert stats.target_passes < len(plain)
        assert f"{stats.alternatives} verified, {stats.alternatives_accepted} kept" in stats.summary()
        assert stats.to_dict()["alternatives_accepted"] == stats.alternatives_accepted


def test_alternatives_are_ignored_when_sampling_or_without_tree_support():
    hf = tiny_llama(seed=1)
    prompt = [1, 5, 9, 2]
    plain = Engine(NativeModel(hf), NoDrafter()).generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[])
    hf_engine = Engine(HFModel(hf), OracleTreeDrafter(plain.token_ids, len(prompt)), gamma=4)
    result = hf_engine.generate(prompt, GREEDY, max_new_tokens=24, eos_token_ids=[])
    assert result.token_ids == plain.token_ids and result.stats.alternatives == 0
    sampled = Engine(NativeModel(hf), OracleTreeDrafter(plain.token_ids, len(prompt)), gamma=4)
    result = sampled.generate(prompt, SamplingParams(temperature=1.0, seed=3), max_new_tokens=24, eos_token_ids=[])
    assert result.stats.alternatives == 0


@pytest.mark.parametrize("gamma", [1, 4, "auto"])
def test_head_with_alternatives_keeps_greedy_output(gamma):
    hf = tiny_llama(seed=1)
    target = NativeModel(hf)
    head = _head(hf, seed=2)
    for prompt in ([1, 5, 9, 2], [3, 3, 3, 40, 41, 42, 3]):
        plain = Engine(target, NoDrafter()).generate(prompt, GREEDY, max_new_tokens=40, eos_token_ids=[]).token_ids
        drafter = HeadDrafter(head, target, alternatives=(3, 1))
        result = Engine(target, drafter, gamma=gamma).generate(prompt, GREEDY, max_new_tokens=40, eos_token_ids=[])
        assert result.token_ids == plain
        if gamma != "auto":
            assert result.stats.alternatives > 0


def test_tree_option_parsing_and_plumbing():
    from specwise.cli import build_parser
    from specwise.drafters import parse_tree

    assert parse_tree("2,1") == (2, 1) and parse_tree("none") == () and parse_tree("3") == (3,)
    for bad in ("2,x", "-1", "9,9,9"):
        with pytest.raises(ValueError, match="--tree"):
            parse_tree(bad)
    args = build_parser().parse_args(["generate", "hi", "--tree", "2,1"])
    assert args.tree == (2, 1)
    assert build_parser().parse_args(["generate", "hi"]).tree is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--tree", "two"])
