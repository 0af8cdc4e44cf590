"""The values a decoding step passes (:mod:`specwise.engine` applies the rules to them): a request and the same
request checked, a sequence (``Slot``) with the request running on it (``Run``), what a step puts in the target's pass
for one sequence (``StepPlan``) and gets back from verifying it (``StepResult``), and what a step did (``BatchStep``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specwise.constraints import GrammarState
from specwise.events import GenerationEvent, LogprobOptions, StopText
from specwise.metrics import SpecStats
from specwise.models.base import Model
from specwise.planner import PlanState, Proposal
from specwise.sampling import SamplingParams

__all__ = ["BatchStep", "CheckedRequest", "Request", "Run", "Slot", "StepPlan", "StepResult"]


@dataclass
class Request:
    """What to generate: the arguments of :meth:`Engine.stream` (``prediction``: the request's predicted output, a
    draft source of its own). ``Engine.check_request`` checks one for both engines."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    eos_token_ids: list[int] | None = None
    logprobs: LogprobOptions | None = None
    prediction: list[int] | None = None


@dataclass
class CheckedRequest:
    """A request that passed :meth:`Engine.check_request`: its fields as the step uses them (token ids as ints,
    the end tokens resolved) and its grammar's matcher built; nothing about it is refused later."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    stop: list[str]
    eos: set[int]
    logprobs: LogprobOptions | None
    prediction: list[int]
    grammar: GrammarState | None


class Run:
    """One request being generated on a sequence: the planner's state of its drafters, its randomness, text,
    statistics and context (prompt and output so far). The engine's step advances it; nothing else writes it."""

    def __init__(self, target: Model, state: PlanState, request: CheckedRequest, tokenizer, cached: int = 0) -> None:
        params = request.params
        self.target, self.state, self.params = target, state, params
        self.prompt_ids = request.prompt_ids
        self.max_new_tokens = request.max_new_tokens
        self.eos = request.eos
        self.logprobs = request.logprobs  # what to record of the emitted tokens (None: nothing)
        self.grammar = request.grammar  # the constraint's matcher (params.constraint), advanced by the steps
        self.generator = params.generator() if not params.greedy else None
        self.uniforms = params.uniforms() if not params.greedy else None
        self.stats = SpecStats(prompt_tokens=len(self.prompt_ids), cached_tokens=cached)
        self.text = StopText(tokenizer, request.stop)
        self.context = list(self.prompt_ids)
        self.produced = 0
        self.finish: str | None = None
        self.prefill_done = False
        self.t0 = time.perf_counter()

    @property
    def cached(self) -> int:
        """Leading prompt tokens whose cache a previous request left (prompt caching) or another sequence's cache
        gave (:meth:`copied`)."""
        return self.stats.cached_tokens

    def copied(self, length: int) -> None:
        """The cache now holds the prompt's first ``length`` tokens, copied from another sequence's cache (a prefix
        another conversation shares, ``Model.copy_prefix``): they are not fed, and count as cached."""
        self.stats.cached_tokens = length

    def prefill_tokens(self) -> list[int]:
        """What goes into the cache before the first step: the prompt but its last token (and but the positions
        kept from the previous request, ``cached``)."""
        return self.prompt_ids[self.cached : -1]

    def prefilled(self) -> None:
        """The prompt is in the cache: its time is the prefill's."""
        self.prefill_done = True
        self.stats.prefill_seconds = time.perf_counter() - self.t0


@dataclass
class StepPlan:
    """What one sequence puts in a step's target pass, and all that verifying it needs besides the pass's logits.

    proposal: the planner's draft (cut where the grammar forbids a token) and the source that made it.
    forced: the tokens the grammar forces here (jump-forward), fed after the last token and before the draft in the
        same pass, emitted whatever the draft's fate.
    masks: bool ``[k + 1, vocab]``, the grammar's allowed tokens at each row that judges the draft (None: no grammar).
    tokens: the pass's input, ``Model.forward``'s: the last emitted token, the forced ones, the draft.
    """

    proposal: Proposal
    tokens: list[int]
    forced: list[int] = field(default_factory=list)
    masks: np.ndarray | None = None

    @property
    def logits_kept(self) -> int:
        """The rows of the pass whose logits the verification reads: the last ``k + 1``."""
        return len(self.proposal.draft) + 1


@dataclass
class StepResult:
    """What verifying one sequence's rows gave: its event, how many drafted tokens were accepted, and the token the
    target chose after them (the recovered or the bonus token: the planner judges the drafts that lost by it)."""

    event: GenerationEvent
    accepted: int
    following: int | None = None


@dataclass
class Slot:
    """A sequence of the target with its drafters' planner state: what a step advances. It carries one request
    (``run``) at a time, fed its prompt in chunks (``prefill_at``) before its first decoding step.

    cache: what the target's cache held after the last step of its last request (that request's context, the
        cache's ``feeds`` then, whether it kept features): a next request whose prompt shares a prefix keeps it
        (prompt caching, :func:`kept_prefix`), and another slot's request may copy it (``BatchEngine``).
    rid: the id its request is known by in the step's events and errors.
    """

    target: Model
    state: PlanState
    run: Run | None = None
    rid: int = 0
    prefill_at: int = 0
    cache: tuple[list[int], int | None, bool] | None = None


@dataclass
class BatchStep:
    """What one step did: the events per request id (finished requests' last events included), how many
    sequences and rows shared the pass, how long it took and on how many threads, and the requests that failed on
    their own (a ValueError from their plan or verification, e.g. a temperature so low that their logits
    overflow): those end, the others go on. Where the step's time went: ``pass_seconds`` in the target's pass,
    the rest (``seconds - pass_seconds``) in each sequence's planning, drafting and verification."""

    events: list[tuple[int, GenerationEvent]]
    sequences: int = 0
    rows: int = 0
    seconds: float = 0.0
    errors: list[tuple[int, ValueError]] = field(default_factory=list)
    prefill_copied: int = 0  # prompt tokens copied from another sequence's cache instead of fed
    prefill_fed: int = 0  # prompt tokens fed to the target
    pass_seconds: float = 0.0
    threads: int | None = None  # the thread count of the pass (None: the model does not choose one)
