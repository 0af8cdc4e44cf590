"""The decoding step: plan, draft, verify in one target pass, accept, roll back, stream; over one sequence
(``Engine.stream``) or several sharing the pass (``Engine.step``, which :mod:`specwise.batch` schedules).

Each step the planner asks the drafter (or one of several) for tokens (:mod:`specwise.planner`); the engine feeds
the target the last emitted token followed by the ``k`` drafted tokens and gets ``k + 1`` distributions back:
``p_0 .. p_{k-1}`` judge the drafts and ``p_k`` gives the bonus token. The rejection rule keeps a prefix of the
draft and adds one token; the target cache is rolled back to the kept tokens. With no drafter (or an empty draft)
the step is a plain decoding step, so the baseline runs through the same code.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from specwise.constraints import GrammarState, constrain_logits
from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.none import NoDrafter
from specwise.drafters.prediction import PredictionDrafter
from specwise.events import (
    GenerationEvent,
    GenerationResult,
    LogprobOptions,
    StopText,
    TokenLogprob,
    token_logprobs,
)
from specwise.models.base import Model
from specwise.planner import Planner, PlanState, Proposal, make_planner
from specwise.rejection import verify
from specwise.sampling import SamplingParams
from specwise.step import BatchStep, CheckedRequest, Request, Run, Slot, StepPlan, StepResult

__all__ = [
    "BatchStep",
    "CheckedRequest",
    "Engine",
    "GenerationEvent",
    "GenerationResult",
    "LogprobOptions",
    "Request",
    "Run",
    "Slot",
    "StepPlan",
    "StepResult",
    "StopText",
    "TokenLogprob",
    "kept_prefix",
    "token_logprobs",
]


def kept_prefix(
    cache: tuple[list[int], int | None, bool] | None, target: Model, sources: list[Drafter], prompt: list[int]
) -> int:
    """How many leading tokens of ``prompt`` ``target``'s cache holds, given what it held after its last request
    (``cache``: that request's context, the cache's ``feeds`` then, whether it kept features): the prefix they
    share, but the prompt's last token (always fed, for the first step). 0 when anything else wrote the cache since
    (``feeds`` changed) or the request's ``sources`` need features the cache did not keep. Exact by the Model
    contract: rolling back and feeding gives a fresh cache's logits."""
    if cache is None:
        return 0
    context, feeds, had_features = cache
    features = any(d.needs_features for d in sources)
    if feeds is None or feeds != target.feeds or (features and not had_features):
        return 0
    return min(common_prefix(context, prompt, limit=len(prompt) - 1), target.length)


class Engine:
    """Speculative decoding with a target Model and a Drafter: one sequence at a time (``stream``, ``generate``),
    and the step that :class:`~specwise.batch.BatchEngine` runs over several (:meth:`step`): a single stream is a
    batch of one over the same step.

    drafter: a Drafter, or a list of them (several sources: each step the planner drafts with the one expected to
        give the most tokens per second); None decodes plainly. Kept as ``drafters``, always a list.
    gamma: tokens drafted per step (0 gives plain decoding), ``"auto"`` for the adaptive planner, or a Planner.
    cost_curve: the relative cost c(k) of target passes over k tokens that `specwise profile` measured, the
        adaptive planner's prior (None: a default curve, then what it measures).
    tokenizer: decodes text and stop strings (optional when working with token ids only).
    eos_token_ids: tokens that end generation (default: the tokenizer's EOS token); a request can override them.
    jump_forward: under a constraint, feed the tokens the grammar forces (the only ones it allows) in the next pass
        without a pass of their own (exact: p and q are one-hot on them). False gives each its own pass, as a decoder
        without jump-forward does: the reference the benchmarks measure it against.
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafter | Sequence[Drafter] | None = None,
        gamma: int | str | Planner = 4,
        tokenizer=None,
        eos_token_ids: Iterable[int] | None = None,
        cost_curve: dict[int, float] | None = None,
        jump_forward: bool = True,
    ) -> None:
        self.planner = make_planner(gamma, cost_curve=cost_curve)
        self.jump_forward = jump_forward
        self.target = target
        self.drafters = _as_sources(drafter, target)
        self.gamma = self.planner.gamma
        self.tokenizer = tokenizer
        self.eos_token_ids = None if eos_token_ids is None else set(eos_token_ids)
        self._slot: Slot | None = None  # the sequence of ``stream``: the target with its drafters' state, kept from
        # request to request (its cache: what the next request may keep of the target's cache)

    def eos_ids(self, eos_token_ids: Iterable[int] | None = None) -> set[int]:
        """The tokens a request stops at: its own ``eos_token_ids``, else the engine's, else its tokenizer's end
        token (none without a tokenizer)."""
        if eos_token_ids is not None:
            return set(_token_ids(eos_token_ids, "eos_token_ids"))
        if self.eos_token_ids is not None:
            return set(self.eos_token_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {eos} if eos is not None else set()

    def check_request(self, request: Request) -> CheckedRequest:
        """``request`` checked and made ready to start, or ValueError naming the problem (what ``stream`` and
        ``BatchEngine.submit`` both call, so that a request one refuses the other refuses with the same message).
        Its grammar is built here: a constraint the matcher rejects fails now, not in a step."""
        params = SamplingParams() if request.params is None else request.params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a specwise.sampling.SamplingParams, got {type(params).__name__}")
        params = dataclasses.replace(params)  # its own checks again (an instance edited after them is refused)
        logprobs = request.logprobs
        if logprobs is not None and not isinstance(logprobs, LogprobOptions):
            raise ValueError(f"logprobs must be a LogprobOptions or None, got {type(logprobs).__name__}")
        if isinstance(request.stop, str) or not all(isinstance(s, str) for s in request.stop):
            raise ValueError("stop must be a list of strings")
        stop = list(request.stop)
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass tokenizer= to the Engine")
        if params.constraint is not None and self.tokenizer is None:
            raise ValueError("a constraint needs a tokenizer: pass tokenizer= to the Engine")
        prompt = _token_ids(request.prompt_ids, "the prompt")
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        max_new = request.max_new_tokens
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new!r}")
        limit = self.target.max_length
        if limit is not None and len(prompt) >= limit:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the model's context is {limit}: shorten the prompt"
            )
        vocab = self.target.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        prediction = _token_ids(request.prediction, "prediction")
        bad = [t for t in prediction if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"prediction token id {bad[0]} is outside the vocabulary (0..{vocab - 1}): "
                "give token ids of the target's tokenizer"
            )
        eos = self.eos_ids(request.eos_token_ids)
        grammar = None
        if params.constraint is not None:
            grammar = GrammarState(params.constraint, self.tokenizer, vocab, eos)
        return CheckedRequest(prompt, params, max_new, stop, eos, logprobs, prediction, grammar)

    def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        max_new_tokens: int = 128,
        stop: Iterable[str] = (),
        eos_token_ids: Iterable[int] | None = None,
        logprobs: LogprobOptions | None = None,
        prediction: Sequence[int] | None = None,
    ) -> Iterator[GenerationEvent]:
        """Generate after ``prompt_ids``; yields one event per target pass, the last with finish_reason and stats
        (``logprobs``: also each emitted token's log-probability).

        prediction: token ids the output is expected to repeat for the most part (a file to edit, a text to
            revise): drafted by a source of this request's own, asked before the engine's drafters
            (:class:`~specwise.drafters.prediction.PredictionDrafter`). The output is the one without it; its
            drafted and accepted tokens are ``stats.by_drafter["prediction"]``."""
        request = Request(prompt_ids, params, max_new_tokens, stop, eos_token_ids, logprobs, prediction)
        checked = self.check_request(request)
        slot = self._slot
        if slot is None or slot.target is not self.target or not _same(slot.state.sources, self.drafters):
            slot = self._slot = Slot(self.target, self.planner.new_state(self.drafters))
        keep = kept_prefix(slot.cache, slot.target, slot.state.sources, checked.prompt_ids)
        self.begin(slot, checked, keep)
        while slot.run.finish is None:
            step = self.step([slot])
            if step.errors:
                raise step.errors[0][1]
            for _, event in step.events:
                yield event

    @property
    def _state(self) -> PlanState | None:
        """The planner's state of ``stream``'s sequence (None before its first request)."""
        return None if self._slot is None else self._slot.state

    def forget_cache(self) -> None:
        """Let the next request of ``stream`` feed its whole prompt (prompt caching off for one request: what a
        measurement of a cold cache needs)."""
        if self._slot is not None:
            self._slot.cache = None

    def begin(self, slot: Slot, request: CheckedRequest, keep: int = 0) -> Run:
        """Start ``request`` on ``slot``: its drafters begun (and its prediction's, asked first), its cache emptied
        but its first ``keep`` positions (already the prompt's: :func:`kept_prefix`; the rest of the prompt is fed by
        the next steps). Returns the slot's new run."""
        target, state = slot.target, slot.state
        if request.prediction:
            state = self.planner.for_request(state, PredictionDrafter(request.prediction, device=target.device))
        run = Run(target, state, request, self.tokenizer, keep)
        target.rollback(keep)
        target.discard_past_length()  # an earlier request's tokens past the kept prompt are not this one's work
        target.set_keep_features(any(d.needs_features for d in state.sources))
        for drafter in state.sources:
            drafter.begin(request.prompt_ids)
        self.planner.begin(state)
        slot.run, slot.cache, slot.prefill_at = run, None, 0
        return run

    def step(self, slots: list[Slot], prefill_chunk: int | None | Sequence[int | None] = None) -> BatchStep:
        """One target pass for every slot's request: each slot puts its next prompt chunk (at most
        ``prefill_chunk`` tokens, or per slot a list of such limits; None: the rest of the prompt) or its planned
        step in the pass; then each decoding slot's rows are verified and its event made. The one step of ``stream``
        (one slot) and ``BatchEngine`` (which chooses each prompt's slice by what it costs).

        A request that fails on its own (a ValueError from its plan or verification) is in the result's
        ``errors`` and its run is over (``finish`` "error"); the others go on."""
        began = time.perf_counter()
        planner = self.planner
        threads = self.target.pass_threads()
        if threads is not None:
            planner.use_threads(threads.in_use)
        chunks, rows, tokens = self._prompt_chunks(slots, prefill_chunk)
        out = BatchStep([])
        fed: list[tuple[Slot, list[int] | None, StepPlan | None]] = []
        for slot, chunk in zip(slots, chunks):
            if chunk is not None:
                if slot.prefill_at == 0:  # the cache made room for the whole prompt at once, not doubling on the way
                    slot.target.reserve(len(slot.run.prompt_ids) + 1)
                out.prefill_fed += len(chunk)
                fed.append((slot, chunk, None))
                continue
            try:
                plan = self.plan(slot.run, batch=(rows - 1, tokens - 1.0) if len(slots) > 1 else None)
            except ValueError as err:  # this request's own failure: it alone ends
                self._fail(slot, err, out)
                rows, tokens = rows - 1, tokens - 1.0
                continue
            rows += len(plan.tokens) - 1
            tokens += planner.expected_gain(slot.run.state, plan.proposal) + len(plan.forced)
            fed.append((slot, None, plan))
        if not fed:
            out.seconds = time.perf_counter() - began
            return out
        items = [(slot.target, chunk if plan is None else plan.tokens) for slot, chunk, plan in fed]
        keeps = [0 if plan is None else plan.logits_kept for _, _, plan in fed]
        t_pass = time.perf_counter()
        if len(items) == 1:  # a sequence alone: its own forward (a decoding pass in one native call where built)
            outputs = [items[0][0].forward(items[0][1], keeps[0])]
        else:
            outputs = self.target.forward_batch(items, keeps)
        out.pass_seconds = time.perf_counter() - t_pass
        threads = self.target.pass_threads()
        if threads is not None:  # the pass may have been a try of the other count
            planner.use_threads(threads.last)
            out.threads = threads.last
        for (slot, chunk, plan), logits in zip(fed, outputs):
            run = slot.run
            if plan is None:
                slot.prefill_at += len(chunk)
                # what the cache holds now (the prompt so far): kept should the request end before its first token
                # (a client that gives up waiting and asks again finds the prompt read so far)
                slot.cache = (run.context, slot.target.feeds, slot.target.keep_features)
                if slot.prefill_at >= len(run.prefill_tokens()):
                    run.prefilled()
                continue
            try:
                result = self.finish_step(run, plan, logits, t_pass)
            except ValueError as err:  # this request's own failure: it alone ends
                self._fail(slot, err, out)
                continue
            # a pass of its own is timed whole (verification included); a shared one is told once, below
            seconds = time.perf_counter() - t_pass if len(items) == 1 else None
            planner.observe(run.state, plan.proposal, result.accepted, seconds, len(plan.forced), result.following)
            slot.cache = (run.context, slot.target.feeds, slot.target.keep_features)
            out.events.append((slot.rid, result.event))
        if len(items) > 1:
            planner.observe_pass(rows, out.pass_seconds)
        out.sequences, out.rows = len(items), rows
        out.seconds = time.perf_counter() - began
        return out

    @staticmethod
    def _prompt_chunks(
        slots: list[Slot], prefill_chunk: int | None | Sequence[int | None]
    ) -> tuple[list[list[int] | None], int, float]:
        """Per slot, the prompt tokens it feeds this step (None: a decoding step), the pass's rows so far (a
        decoding step's first) and the tokens its decoding steps are expected to emit so far (one each)."""
        if prefill_chunk is None or isinstance(prefill_chunk, int):
            limits: Sequence[int | None] = [prefill_chunk] * len(slots)
        elif len(prefill_chunk) != len(slots):
            raise ValueError(f"{len(slots)} slots need {len(slots)} prefill limits, got {len(prefill_chunk)}")
        else:
            limits = prefill_chunk
        if any(limit is not None and limit < 1 for limit in limits):
            raise ValueError(f"prefill limits must be >= 1 (or None), got {list(limits)}")
        chunks: list[list[int] | None] = []
        rows, tokens = 0, 0.0
        for slot, limit in zip(slots, limits):
            run = slot.run
            chunk = None
            if not run.prefill_done:
                rest = run.prefill_tokens()[slot.prefill_at :]
                if rest:
                    chunk = rest[:limit] if limit is not None else rest
                else:
                    run.prefilled()
            chunks.append(chunk)
            if chunk is None:
                rows, tokens = rows + 1, tokens + 1.0
            else:
                rows += len(chunk)
        return chunks, rows, tokens

    @staticmethod
    def _fail(slot: Slot, err: ValueError, out: BatchStep) -> None:
        slot.run.finish = "error"
        out.errors.append((slot.rid, err))

    def plan(self, run: Run, batch: tuple[int, float] | None = None) -> StepPlan:
        """``run``'s next step: the planner's draft, the tokens the grammar forces before it and the masks for
        verifying it (``batch``: what others put in a shared pass, as (rows, tokens they are expected to emit))."""
        limit = run.max_new_tokens - run.produced - 1
        if run.target.max_length is not None:
            limit = min(limit, run.target.max_length - len(run.context))
        t0 = time.perf_counter()
        context, forced, masks = run.context, [], None
        if run.grammar is not None and run.logprobs is None and self.jump_forward:  # (logprobs: the pass's own)
            forced = run.grammar.forced(limit)
            limit -= len(forced)
            context = context + forced
        proposal = self.planner.draft(run.state, context, limit, run.params, run.generator, batch)
        if run.grammar is not None:
            proposal, masks = self._constrain(run, proposal)
        run.stats.draft_seconds += time.perf_counter() - t0
        tokens = run.context[-1:] + forced
        if len(proposal.draft):
            tokens += proposal.draft.ids
        return StepPlan(proposal, tokens, forced, masks)

    @staticmethod
    def _constrain(run: Run, proposal: Proposal) -> tuple[Proposal, np.ndarray]:
        """The draft under the grammar: cut at the first token it forbids (a token drafted with q: drawn again
        from q masked, see GrammarState.sampled_draft), with the masks for verifying it ``[k + 1, vocab]``."""
        draft = proposal.draft
        if draft.probs is None or run.params.greedy:
            masks, n = run.grammar.draft_masks(draft.ids)
            cut = draft.prefix(n) if n < len(draft) else draft
        else:
            tokens, q, masks = run.grammar.sampled_draft(draft.ids, draft.probs, run.generator)
            if tokens == draft.ids and len(q) == len(draft):
                cut = Draft(tokens, q, draft.confidence, draft.kind, draft.device)
            else:
                confidence = None if draft.confidence is None else draft.confidence[: len(tokens)]
                cut = Draft(tokens, q, confidence, draft.kind, draft.device)
        if cut is draft:
            return proposal, masks
        reason = proposal.reason or (None if len(cut) else "grammar")
        return Proposal(cut, proposal.source, reason, alternatives=proposal.alternatives), masks

    def finish_step(self, run: Run, plan: StepPlan, logits: np.ndarray, t_pass: float) -> StepResult:
        """Verify ``plan``'s draft against ``logits`` ``[k + 1, vocab]`` (the rows that judge it) of the pass begun
        at ``t_pass`` (a ``perf_counter`` time), roll the cache back to the kept tokens, advance ``run`` and return
        the step's event with the number of drafted tokens accepted."""
        proposal, forced = plan.proposal, plan.forced
        draft, params, stats = proposal.draft, run.params, run.stats
        k = len(draft)
        if k == 0:
            stats.plain_step_reasons[proposal.reason] = stats.plain_step_reasons.get(proposal.reason, 0) + 1
        start = len(run.context) - 1  # where the last emitted token went into the cache
        raw = logits
        if run.grammar is not None:  # p under the grammar: forbidden tokens at -inf before any other transform
            logits = constrain_logits(logits, plan.masks)
        at = len(run.context) + len(forced) - len(run.prompt_ids)  # the output position of row 0
        uniforms = None if params.greedy else (lambda i: run.uniforms(at + i))
        new = verify(draft.ids, draft.probs, logits, params, run.generator, uniforms)
        accepted = len(new) - 1
        following = int(new[-1])  # the target's token after the kept ones
        run.target.rollback(start + 1 + len(forced) + accepted)
        stats.verify_seconds += time.perf_counter() - t_pass
        grammar_done = False
        if run.grammar is not None:  # the output ends where the grammar is complete (an end token adds nothing)
            new, grammar_done = self._advance_grammar(run, forced, new)
        elif forced:
            new = forced + new

        remaining = run.max_new_tokens - run.produced
        finish = None
        for i, token in enumerate(new):
            if token in run.eos:
                new, finish = new[: i + 1], "stop"
                break
        if len(new) >= remaining:
            new = new[:remaining]
            finish = finish or "length"
        limit = run.target.max_length
        if finish is None and limit is not None and len(run.context) + len(new) >= limit:
            finish = "length"
        if grammar_done and finish is None:
            finish = "stop"  # the grammar is complete: nothing but an end token could follow
        from_draft = min(accepted, max(0, len(new) - len(forced)))
        stats.record_step(k, from_draft, len(new), run.state.sources[proposal.source].name if k else None)

        piece, kept, stopped = run.text.feed(new, final=finish is not None)
        if stopped:
            finish = "stop"
            stats.new_tokens -= len(new) - len(kept)
            from_draft = min(from_draft, len(kept))
        stats.forced += min(len(forced), len(kept))  # counted in new_tokens, never as drafted or accepted
        run.context.extend(kept)
        run.produced += len(kept)
        run.finish = finish
        event = GenerationEvent(piece, kept, from_draft)
        if run.logprobs is not None:  # emitted token i was chosen from row i of the pass: the target's
            rows = logits if run.logprobs.sampled else raw  # sampled: the distribution drawn from, grammar included
            event.logprobs = token_logprobs(rows[: len(kept)], kept, run.logprobs, params)
        if finish is not None:
            stats.total_seconds = time.perf_counter() - run.t0
            event.finish_reason, event.stats = finish, stats
        return StepResult(event, accepted, following)

    @staticmethod
    def _advance_grammar(run: Run, forced: list[int], new: list[int]) -> tuple[list[int], bool]:
        """Feed the step's verified tokens to the grammar (the forced ones it has); returns the step's tokens, cut
        where the grammar became complete, and whether it did."""
        grammar = run.grammar
        if grammar.done:  # the forced tokens completed the output: the pass could only add an end token
            return list(forced), True
        for i, token in enumerate(new):
            grammar.advance([token])
            if token in run.eos:
                break
            if grammar.done:
                return forced + new[: i + 1], True
        return forced + new, False

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        max_new_tokens: int = 128,
        stop: Iterable[str] = (),
        eos_token_ids: Iterable[int] | None = None,
        logprobs: LogprobOptions | None = None,
        prediction: Sequence[int] | None = None,
    ) -> GenerationResult:
        """Run :meth:`stream` to the end and collect its output."""
        texts: list[str] = []
        ids: list[int] = []
        logs: list[TokenLogprob] | None = None if logprobs is None else []
        for event in self.stream(prompt_ids, params, max_new_tokens, stop, eos_token_ids, logprobs, prediction):
            texts.append(event.text)
            ids.extend(event.token_ids)
            if logs is not None:
                logs.extend(event.logprobs)
            if event.finish_reason is not None:
                return GenerationResult("".join(texts), ids, event.finish_reason, event.stats, logs)
        raise RuntimeError("generation ended without a final event")  # unreachable


def _as_sources(drafter: Drafter | Sequence[Drafter] | None, target: Model) -> list[Drafter]:
    """The engine's sources from what its caller gave: None is plain decoding, one drafter is a list of one."""
    if drafter is None:
        return [NoDrafter(target.device)]
    return list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]


def _token_ids(ids: Sequence[int] | None, what: str) -> list[int]:
    """``ids`` as a list of ints (None: empty); ValueError naming ``what`` for anything but integers."""
    if ids is None:
        return []
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise ValueError(f"{what} must be a list of token ids (integers)") from None


def _same(a: list[Drafter], b: list[Drafter]) -> bool:
    """Whether two lists hold the same drafters (the same objects) in the same order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
