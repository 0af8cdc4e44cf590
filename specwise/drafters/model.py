"""The `model` drafter: any causal LM that shares the target's vocabulary."""

from __future__ import annotations

import torch

from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.models.base import Model
from specwise.sampling import SamplingParams, probs_from_logits, sample


class ModelDrafter(Drafter):
    """Drafts autoregressively with a smaller model; keeps its own KV cache in step with the context.

    Before each proposal the drafter rolls its cache back to the longest prefix it shares with the context
    and feeds what is new (the accepted tokens, the recovered or bonus token, and, after an all-accepted
    step, its own last draft, which it had not yet fed).
    """

    name = "model"

    def __init__(self, model: Model) -> None:
        self.model = model
        self.device = model.device
        self._fed: list[int] = []  # tokens in the draft model's cache

    def _forked(self, target: Model) -> None:
        self.model = self.model.sequence()  # the draft model's weights, its own cache
        self._fed = []

    def begin(self, prompt: list[int]) -> None:
        self.model.reset()
        self._fed = []

    def pending(self, context: list[int]) -> int:
        return len(context) - common_prefix(self._fed, context, limit=len(context) - 1)

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Bring the cache to ``context[:-1]`` plus the last token; return logits for the next token."""
        common = common_prefix(self._fed, context, limit=len(context) - 1)
        self.model.rollback(common)
        del self._fed[common:]
        new = context[common:]
        self.catch_up = len(new)
        logits = self.model.forward(torch.tensor(new, dtype=torch.int64, device=self.device), num_logits=1)
        self._fed.extend(new)
        return logits[-1]

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None, stop: float = 0.0
    ) -> Draft:
        if k <= 0:
            return Draft.empty(self.device)
        logits = self._sync(context)  # [vocab]
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probs_from_logits(logits, params)  # [vocab]
                token = int(sample(q, generator))
                probs.append(q)
            tokens.append(token)
            if i + 1 < k:
                logits = self.model.forward(torch.tensor([token], device=self.device), num_logits=1)[-1]
                self._fed.append(token)
        draft_probs = torch.stack(probs) if probs else None
        return Draft(torch.tensor(tokens, dtype=torch.int64, device=self.device), draft_probs)
