"""The decoding loop: plan, draft, verify in one target pass, accept, roll back, stream.

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
from dataclasses import dataclass, field

import numpy as np

from specwise.constraints import GrammarState, constrain_logits
from specwise.drafters.base import Draft, Drafter, common_prefix
from specwise.drafters.none import NoDrafter
from specwise.drafters.prediction import PredictionDrafter
from specwise.metrics import SpecStats
from specwise.models.base import Model
from specwise.planner import Planner, PlanState, Proposal, make_planner
from specwise.rejection import verify
from specwise.sampling import SamplingParams, log_probs

__all__ = [
    "CheckedRequest",
    "Engine",
    "GenerationEvent",
    "GenerationResult",
    "LogprobOptions",
    "Request",
    "Run",
    "StopText",
    "TokenLogprob",
]


@dataclass(frozen=True)
class LogprobOptions:
    """Opt-in: record the target's log-probability of every emitted token, from the logits of the pass that
    verified it (accepted draft tokens and the recovered or bonus token alike: never the drafter's).

    top: the most likely alternatives to list at each position (0: only the emitted token's log-probability).
    sampled: False (default): of the model's own distribution, ``log_softmax`` of the logits (temperature 1,
        nothing cut), as OpenAI and vLLM report them; True: of the distribution the token was drawn from under
        the request's SamplingParams (temperature, top-k, top-p, min-p; greedy: 0 for the argmax). Alternatives
        of probability 0 are never listed.
    """

    top: int = 0
    sampled: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0:
            raise ValueError(f"top (log-probability alternatives) must be an integer >= 0, got {self.top!r}")


@dataclass
class TokenLogprob:
    """One emitted token's log-probability and the ``top`` most likely tokens at its position (most likely
    first, as ``(token id, log-probability)``)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationEvent:
    """A piece of streamed output: the tokens of one target pass (after stop handling) and their text.

    text: new text since the previous event ("" while text is held back, e.g. a possible stop string).
    token_ids: new token ids.
    num_from_draft: how many of ``token_ids`` were drafted tokens accepted by the target.
    finish_reason: "stop" (EOS or stop string) or "length" on the last event, else None.
    stats: the run's statistics, on the last event only.
    logprobs: one TokenLogprob per token of ``token_ids`` when the request asked for them (LogprobOptions), else
        None.
    """

    text: str
    token_ids: list[int]
    num_from_draft: int = 0
    finish_reason: str | None = None
    stats: SpecStats | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            out["logprobs"] = [{"token_id": t.token_id, "logprob": t.logprob, "top": t.top} for t in self.logprobs]
        return out


class StopText:
    """Incremental detokenization with stop strings: never emits text at or past a stop string.

    Text that could be the start of a stop string, or an incomplete UTF-8 character, is held back until
    the next tokens decide it.
    """

    OVERLAP = 4  # tokens decoded again before the new ones, so that merges across the boundary come out right

    def __init__(self, tokenizer, stop: Iterable[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.sent = 0  # characters of text already emitted
        self._base = 0  # the text of token_ids[:_base] is _base_text, final (no incomplete character at its end)
        self._base_text = ""

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _text(self) -> str:
        """The text of all tokens so far, decoding only the new tokens and a few before them: the text of the
        tokens from ``lo`` with that of ``lo .. _base`` taken off, appended to the text up to ``_base`` (a full
        decode whenever that does not line up, e.g. after an incomplete character)."""
        ids, base = self.token_ids, self._base
        lo = max(0, base - self.OVERLAP)
        head, window = self._decode(ids[lo:base]), self._decode(ids[lo:])
        if window.startswith(head):
            text = self._base_text + window[len(head) :]
        else:
            text = self._decode(ids)
        if not text.endswith("\ufffd"):
            self._base, self._base_text = len(ids), text
        return text

    def feed(self, new_ids: list[int], final: bool) -> tuple[str, list[int], bool]:
        """Add tokens; return (new text, new tokens kept, whether a stop string ended the output)."""
        start = len(self.token_ids)
        self.token_ids.extend(new_ids)
        text = self._text()
        hit = self._first_stop(text)
        if hit is not None:
            # keep the fewest tokens whose text contains the stop string
            for m in range(start + 1, len(self.token_ids) + 1):
                if self._first_stop(self._decode(self.token_ids[:m])) is not None:
                    break
            kept = self.token_ids[start:m]
            del self.token_ids[m:]
            self._base, self._base_text = 0, ""  # the output ends here
            return self._take(text[:hit]), kept, True
        if final:
            return self._take(text), new_ids, False
        end = len(text.rstrip("\ufffd"))  # hold back an incomplete multi-byte character
        safe = end
        for s in self.stop:  # hold back a suffix that could start a stop string
            held = next((n for n in range(min(len(s) - 1, end), 0, -1) if text[:end].endswith(s[:n])), 0)
            safe = min(safe, end - held)
        return self._take(text[: max(safe, self.sent)]), new_ids, False

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def _take(self, text: str) -> str:
        piece = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return piece


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
    """One request being generated: its target sequence, the planner's state of its drafters, its randomness,
    text, statistics and context (prompt and output so far)."""

    def __init__(
        self,
        target: Model,
        state: PlanState,
        params: SamplingParams,
        prompt_ids: list[int],
        max_new_tokens: int,
        eos: set[int],
    ) -> None:
        self.target, self.state, self.params = target, state, params
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.generator = params.generator() if not params.greedy else None
        self.uniforms = params.uniforms() if not params.greedy else None
        self.stats = SpecStats(prompt_tokens=len(prompt_ids))
        self.text: StopText | None = None
        self.context = list(prompt_ids)
        self.produced = 0
        self.finish: str | None = None
        self.last_accepted = 0
        self.logprobs: LogprobOptions | None = None  # what to record of the emitted tokens (None: nothing)
        self.grammar: GrammarState | None = None  # the constraint's matcher (params.constraint), advanced by steps
        self.jumped: list[int] = []  # tokens the grammar forced this step (jump-forward): fed before the draft
        self.masks: np.ndarray | None = None  # bool [k + 1, vocab]: the grammar's masks for verifying this step's draft
        self.t0 = time.perf_counter()

    @property
    def cached(self) -> int:
        """Leading prompt tokens whose cache a previous request left (prompt caching; set by ``Engine.start``)."""
        return self.stats.cached_tokens

    def prefill_tokens(self) -> list[int]:
        """What goes into the cache before the first step: the prompt but its last token (and but the positions
        kept from the previous request, ``cached``)."""
        return self.prompt_ids[self.cached : -1]

    def prefilled(self, seconds: float) -> None:
        self.stats.prefill_seconds = seconds

    def feed(self, proposal: Proposal) -> list[int]:
        """A step's input (token ids for ``Model.forward``): the last emitted token, the tokens the grammar forced,
        then the draft."""
        tokens = self.context[-1:] + self.jumped
        if len(proposal.draft):
            tokens += proposal.draft.ids
        return tokens


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
    """Speculative decoding of one sequence at a time with a target Model and a Drafter.

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
        self._state: PlanState | None = None  # the planner's view of the sequence (kept from request to request)
        self._cache: tuple[list[int], int | None, bool] | None = None  # the last request's context, target.feeds
        # and keep_features after its last step: what the next request may keep of the target's cache

    def _eos_ids(self, eos_token_ids: Iterable[int] | None) -> set[int]:
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
        eos = self._eos_ids(request.eos_token_ids)
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
        if self._state is None or not _same(self._state.sources, self.drafters):
            self._state = self.planner.new_state(self.drafters)
        keep = self._reusable(checked.prompt_ids)
        self._cache = None
        run = self.start(self.target, self._state, checked, keep)
        prefill = run.prefill_tokens()
        if prefill:
            self.target.forward(prefill, num_logits=0)
        run.prefilled(time.perf_counter() - run.t0)
        governor = getattr(self.target, "governor", None)  # the thread count of the native model's passes
        while run.finish is None:
            if governor is not None:
                self.planner.use_threads(governor.in_use())
            proposal = self.plan(run)
            t1 = time.perf_counter()
            logits = self.target.forward(run.feed(proposal))  # [k + 1, vocab]
            event = self.finish_step(run, proposal, logits, t1)
            if governor is not None:  # the pass may have been a try of the other count
                self.planner.use_threads(governor.last)
            self.planner.observe(run.state, proposal, run.last_accepted, time.perf_counter() - t1)
            self._cache = (run.context, self.target.feeds, self.target.keep_features)
            yield event

    def _reusable(self, prompt_ids: list[int]) -> int:
        """How many leading prompt tokens the target's cache holds from the previous request (prompt caching: a
        shared system prompt or the turns of a chat are not fed again). Exact by the Model contract (rolling back
        and feeding gives the logits of a fresh cache); 0 when anything else wrote the cache since, or when the
        request needs features that were not kept. The last prompt token is always fed, for the first step."""
        return kept_prefix(self._cache, self.target, self._state.sources, prompt_ids)

    def start(self, target: Model, state: PlanState, request: CheckedRequest, keep: int = 0) -> Run:
        """A new request on the sequence ``target`` (this engine's target, or one of its sequences) drafted by
        ``state``'s sources (and by its prediction's, asked first): its drafters begun, its cache emptied but its
        first ``keep`` positions (already the prompt's: see ``_reusable``; the rest of the prompt is not fed
        yet)."""
        if request.prediction:
            state = self.planner.for_request(state, PredictionDrafter(request.prediction, device=target.device))
        run = Run(target, state, request.params, request.prompt_ids, request.max_new_tokens, request.eos)
        run.logprobs = request.logprobs
        run.grammar = request.grammar
        run.text = StopText(self.tokenizer, request.stop)
        target.rollback(keep)
        run.stats.cached_tokens = keep
        target.keep_features = any(d.needs_features for d in state.sources)
        for drafter in state.sources:
            drafter.begin(request.prompt_ids)
        self.planner.begin(state)
        return run

    def plan(self, run: Run, batch: tuple[int, float] | None = None) -> Proposal:
        """The planner's draft for ``run``'s next step (``batch``: what others put in a shared pass)."""
        limit = run.max_new_tokens - run.produced - 1
        if run.target.max_length is not None:
            limit = min(limit, run.target.max_length - len(run.context))
        t0 = time.perf_counter()
        context = run.context
        if run.grammar is not None and run.logprobs is None and self.jump_forward:  # (logprobs: the pass's own)
            run.jumped = run.grammar.forced(limit)
            limit -= len(run.jumped)
            context = context + run.jumped
        proposal = self.planner.draft(run.state, context, limit, run.params, run.generator, batch)
        if run.grammar is not None:
            proposal = self._constrain(run, proposal)
            proposal.forced = len(run.jumped)  # fed in the same pass: the planner times a pass of their rows too
        run.stats.draft_seconds += time.perf_counter() - t0
        return proposal

    def _constrain(self, run: Run, proposal: Proposal) -> Proposal:
        """The draft under the grammar: cut at the first token it forbids (a token drafted with q: drawn again
        from q masked, see GrammarState.sampled_draft), with the masks for verifying it kept on ``run``."""
        draft = proposal.draft
        if draft.probs is None or run.params.greedy:
            run.masks, n = run.grammar.draft_masks(draft.ids)
            cut = draft.prefix(n) if n < len(draft) else draft
        else:
            tokens, q, run.masks = run.grammar.sampled_draft(draft.ids, draft.probs, run.generator)
            if tokens == draft.ids and len(q) == len(draft):
                cut = Draft(tokens, q, draft.confidence, draft.kind, draft.device)
            else:
                confidence = None if draft.confidence is None else draft.confidence[: len(tokens)]
                cut = Draft(tokens, q, confidence, draft.kind, draft.device)
        if cut is draft:
            return proposal
        reason = proposal.reason or (None if len(cut) else "grammar")
        return Proposal(cut, proposal.source, reason, alternatives=proposal.alternatives)

    def finish_step(self, run: Run, proposal: Proposal, logits: np.ndarray, t_pass: float) -> GenerationEvent:
        """Verify ``proposal`` against ``logits`` ``[k + 1, vocab]`` of the pass begun at ``t_pass`` (a
        ``perf_counter`` time), roll the cache back to the kept tokens, and return the step's event."""
        draft, params, stats = proposal.draft, run.params, run.stats
        k = len(draft)
        if k == 0:
            stats.plain_step_reasons[proposal.reason] = stats.plain_step_reasons.get(proposal.reason, 0) + 1
        start = len(run.context) - 1  # where the last emitted token went into the cache
        jumped, raw = run.jumped, logits
        if jumped or run.grammar is not None:
            logits = logits[-(k + 1) :]  # [k + 1, vocab]: the rows that judge the draft (a batch keeps only those)
        if run.grammar is not None:  # p under the grammar: forbidden tokens at -inf before any other transform
            logits = constrain_logits(logits, run.masks)
        at = len(run.context) + len(jumped) - len(run.prompt_ids)  # the output position of row 0
        uniforms = None if params.greedy else (lambda i: run.uniforms(at + i))
        new = verify(draft.ids, draft.probs, logits, params, run.generator, uniforms)
        accepted = len(new) - 1
        run.target.rollback(start + 1 + len(jumped) + accepted)
        stats.verify_seconds += time.perf_counter() - t_pass
        run.last_accepted = accepted
        grammar_done = False
        if run.grammar is not None:  # the output ends where the grammar is complete (an end token adds nothing)
            new, grammar_done = self._advance_grammar(run, jumped, new)
        elif jumped:
            new = jumped + new
        run.jumped = []

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
        from_draft = min(accepted, max(0, len(new) - len(jumped)))
        stats.record_step(k, from_draft, len(new), run.state.sources[proposal.source].name if k else None)

        piece, kept, stopped = run.text.feed(new, final=finish is not None)
        if stopped:
            finish = "stop"
            stats.new_tokens -= len(new) - len(kept)
            from_draft = min(from_draft, len(kept))
        stats.forced += min(len(jumped), len(kept))  # counted in new_tokens, never as drafted or accepted
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
        return event

    @staticmethod
    def _advance_grammar(run: Run, jumped: list[int], new: list[int]) -> tuple[list[int], bool]:
        """Feed the step's verified tokens to the grammar (the forced ones it has); returns the step's tokens, cut
        where the grammar became complete, and whether it did."""
        grammar = run.grammar
        if grammar.done:  # the forced tokens completed the output: the pass could only add an end token
            return list(jumped), True
        for i, token in enumerate(new):
            grammar.advance([token])
            if token in run.eos:
                break
            if grammar.done:
                return jumped + new[: i + 1], True
        return jumped + new, False

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


def token_logprobs(
    logits: np.ndarray, tokens: list[int], options: LogprobOptions, params: SamplingParams
) -> list[TokenLogprob]:
    """The log-probability of ``tokens[i]`` under row ``i`` of ``logits`` ``[len(tokens), vocab]``, with each
    row's ``options.top`` most likely tokens (most likely first, ties by the lowest id, as the greedy choice; those
    of probability 0 left out)."""
    if not tokens:
        return []
    lp = log_probs(logits, params if options.sampled else None)  # [n, vocab]
    chosen = lp[np.arange(len(tokens)), tokens].tolist()
    top = min(options.top, lp.shape[-1])
    alternatives: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if top:
        for row in range(len(tokens)):
            alternatives[row] = _most_likely(lp[row], top)
    return [TokenLogprob(t, c, a) for t, c, a in zip(tokens, chosen, alternatives)]


def _most_likely(row: np.ndarray, top: int) -> list[tuple[int, float]]:
    """The ``top`` largest finite values of ``row`` as (index, value), largest first, equal values by the lowest
    index: a partition finds the ``top``-th largest value, and only the entries at or above it are sorted."""
    vocab = row.shape[0]
    kth = np.partition(row, vocab - top)[vocab - top] if top < vocab else -np.inf
    candidates = np.flatnonzero(row >= kth) if kth > -np.inf else np.flatnonzero(row > -np.inf)
    values = row[candidates]
    order = np.argsort(-values, kind="stable")[:top]  # stable: equal values keep their ascending ids
    return list(zip(candidates[order].tolist(), values[order].tolist()))


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
