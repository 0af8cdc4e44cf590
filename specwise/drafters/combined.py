"""Several drafters at once (``ngram+head``): each step drafts with the one expected to pay most.

With a fixed gamma, each drafter keeps a per-request estimate of its acceptance rate (accepted / drafted, decayed
so that it follows the text). Before a step the drafters are asked in turn, cheapest first as listed; a later
drafter is asked only if it could do better than the draft in hand: drafter d with estimate a_d and a draft of n
tokens is expected to have a_d + a_d^2 + ... + a_d^n of them accepted. A drafter with nothing to propose (prompt
lookup without a match) is skipped, and a sampled draft is used as soon as it is drawn. So the choice depends only
on the context, past outcomes and deterministic drafts, never on what a sampled draft contains: the output stays
exact.

With the adaptive schedule (``--gamma auto``) the engine calls :meth:`CombinedDrafter.propose_scheduled` instead:
each drafter is a source of the schedule, with its own acceptance by position, drafting time and rate of empty
asks, and is asked for its own best gamma. Drafters are asked in the order listed; a later one only when its
expected tokens per second beat those of the draft in hand, and a draft in hand is used only when it beats a
plain step or is a probe (a drafter not worth asking for a while drafts one token now and then, and that draft is
verified, so that its record follows the text). Prompt lookup at temperature 1 (a copied token is accepted
with probability p(token)) and a trained head are then judged each on its own record, instead of sharing one
estimate that fits neither.
"""

from __future__ import annotations

import time

import torch

from specwise.drafters.base import Draft, Drafter
from specwise.sampling import SamplingParams

__all__ = ["CombinedDrafter"]


def _expected_accepted(alpha: float, n: int) -> float:
    return sum(alpha**i for i in range(1, n + 1))


class CombinedDrafter(Drafter):
    """Chooses per step among ``drafters`` by expected accepted tokens.

    prior: the acceptance assumed before a drafter has been judged, with ``prior_weight`` pseudo-observations;
    decay: how fast old observations are forgotten (per judged step).
    """

    def __init__(self, drafters: list[Drafter], prior: float = 0.5, prior_weight: float = 4.0, decay: float = 0.9):
        if len(drafters) < 2:
            raise ValueError("a combined drafter needs at least two drafters, as in ngram+head")
        self.drafters = drafters
        self.name = "+".join(d.name for d in drafters)
        self.needs_features = any(d.needs_features for d in drafters)
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        for d in self.drafters:
            d.begin(prompt)
        self._drafted = [0.0] * len(self.drafters)
        self._accepted = [0.0] * len(self.drafters)
        self.uses = [0] * len(self.drafters)  # steps drafted by each, this request
        self.chosen: int | None = None  # the drafter of the last proposal

    def acceptance(self, i: int) -> float:
        """Estimated acceptance rate of drafter i."""
        w = self.prior_weight
        return (self._accepted[i] + w * self.prior) / (self._drafted[i] + w)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Draft:
        best: tuple[float, int, Draft] | None = None
        declined = False
        for i, drafter in enumerate(self.drafters):
            alpha = self.acceptance(i)
            if best is not None and _expected_accepted(alpha, k) <= best[0]:
                continue  # cannot beat the draft in hand even with all k tokens
            drafter.min_confidence = self.min_confidence
            draft = drafter.propose(context, k, params, generator)
            if not len(draft):
                declined = declined or drafter.declined
                continue
            if draft.probs is not None:
                # a sampled draft is used as soon as it is drawn: choosing among drafts by what was sampled
                # would bias its tokens away from q and break exactness
                best = (0.0, i, draft)
                break
            value = _expected_accepted(alpha, len(draft))
            if best is None or value > best[0]:
                best = (value, i, draft)
        return self._take(best, declined)

    def propose_scheduled(
        self, context: list[int], schedule, limit: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[Draft, int, int]:
        """Ask the drafters as an adaptive ``schedule`` advises (see the module's notes) and tell it how every ask
        went (``observe_ask``). Returns (the draft, the index of its drafter, the most tokens asked of one)."""
        best: tuple[float, int, Draft] | None = None  # (expected tokens/s, drafter, draft)
        asked = 0
        declined = False
        for i, drafter in enumerate(self.drafters):
            gamma = schedule.choose(limit, source=i)
            if gamma <= 0 or (best is not None and schedule.expected_rate(gamma, source=i) <= best[0]):
                continue
            drafter.min_confidence = schedule.min_confidence(source=i)
            t0 = time.perf_counter()
            draft = drafter.propose(context, gamma, params, generator)
            schedule.observe_ask(gamma, len(draft), time.perf_counter() - t0, source=i)
            asked = max(asked, gamma)
            if not len(draft):
                declined = declined or drafter.declined
                continue
            if draft.probs is not None or schedule.probing(i):  # sampled: used as drawn (see the module's notes);
                best = (float("inf"), i, draft)  # a probe: verified, so that its drafter's record is kept current
                break
            rate = schedule.draft_rate(len(draft), source=i)
            if schedule.worth_drafting(rate) and (best is None or rate > best[0]):
                best = (rate, i, draft)
        draft = self._take(best, declined)
        return draft, self.chosen or 0, asked

    def _take(self, best: tuple[float, int, Draft] | None, declined: bool) -> Draft:
        """Record the chosen proposal (or none: ``declined`` when a drafter held one back) and return it."""
        self.declined = best is None and declined
        if best is None:
            self.chosen = None
            return Draft.empty(getattr(self.drafters[0], "device", "cpu"))
        self.chosen, self._pending = best[1], len(best[2])
        self.uses[best[1]] += 1
        return best[2]

    def source_name(self) -> str:
        return self.name if self.chosen is None else self.drafters[self.chosen].name

    def observe(self, num_accepted: int) -> None:
        if self.chosen is None:
            return
        i = self.chosen
        self.drafters[i].observe(num_accepted)
        self._accepted[i] = self.decay * self._accepted[i] + num_accepted
        self._drafted[i] = self.decay * self._drafted[i] + self._pending
