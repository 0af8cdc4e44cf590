"""Continuous batching: several requests share each target pass, each with its own speculation.

A :class:`BatchEngine` holds up to ``max_batch`` sequences of the engine's target (``Model.sequence``), each with
its own cache, drafters (``Drafter.fork``; a request's prediction is a source of its slot for that request only),
planner state, sampling settings, randomness and statistics. Every
:meth:`BatchEngine.step` plans each running request's draft, scores all their rows in one target pass
(``Model.forward_batch``: ragged, a new request's prompt among them) and verifies each request on its own rows.
Requests join between steps and leave when done; a cancelled one frees its slot at the next step.

A row's logits do not depend on what shares its pass, so each request's output is the one it gets alone:
greedy token for token; sampled, the coupled rule draws every position's token with that position's own uniform,
so a seeded request gives the tokens of the same seeded request run alone (for drafters of single tokens, and
for any drafter under a fixed gamma).

The planner plans for the pass as a whole (``Planner.draft(..., batch=...)``): each request's gamma is chosen for
the pass's tokens per second given the rows the others put in it, so drafting fades out as the batch makes the
pass dear and comes back as it thins.

A joining prompt is fed in slices chosen by what they cost (:class:`PrefillCosts`, measured as the batch runs):
beside sequences that decode, a slice keeps its step within ``max_step_seconds`` and the prompt takes at most
``prefill_share`` of the time, so that the others' streams go on; with nothing else decoding, a long prompt goes in
whole multiples of the layer kernel's rows within the same time. A row's numbers do not depend on its slice, so the
slicing changes no output. A prompt whose prefix another slot's cache holds (a system prompt that sub-agents share
with their parent, a conversation that another slot served) copies it (``Model.copy_prefix``, exact) rather than
reading it again, and the slots' caches are kept within ``cache_memory`` bytes, the free slots' least recently used
dropped first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from specwise.drafters.base import common_prefix
from specwise.engine import Engine, GenerationEvent, kept_prefix
from specwise.models.base import Model
from specwise.prefill import PrefillCosts, default_cache_memory, kernel_rows, position_bytes
from specwise.step import BatchStep, CheckedRequest, Request, Slot

__all__ = ["BatchEngine", "BatchStep", "PrefillCosts", "Request", "default_cache_memory"]


@dataclass
class _Slot(Slot):
    """A slot of the batch, reused by request after request: the engine's :class:`~specwise.engine.Slot` with
    what the batch's scheduling keeps of it."""

    cancelled: bool = False
    order: int = 0  # when its request was admitted (the earliest of several with one prompt prefills it)
    finished: int = -1  # when its last request finished (a count of finished requests; -1: none)
    written: int = 0  # the most positions its cache has held: what its memory holds (a rollback hands none back)
    own: bool = False  # its sequence is the engine's own (a batch of one), whose memory the batch cannot drop


# A request continues a free slot's conversation when the prefix its prompt shares with the slot's cache is at least
# this share of what the cache holds (a chat's next turn shares all of it; another chat only the system prompt)
CONTINUES = 0.5
PREFILL_CHUNK = 256  # prompt tokens a step feeds when the slices are not chosen by cost (max_step_seconds None)
MAX_STEP_SECONDS = 0.4  # the default budget of a step in which other sequences decode (its error: up to 2x seen)
PREFILL_SHARE = 0.4  # the default share of the time a long prompt takes while other sequences decode
FLOOR_SHARE = 0.25  # where decoding alone overruns the budget, a slice still adds this share of a decoding step
REFRESH = 8  # steps feeding a prompt beside decoding ones before one without it (the decoding step measured anew)
COPY_GAIN = 256  # another slot's prefix is copied when it adds a token and 1/COPY_GAIN of its length to what is kept


class BatchEngine:
    """Steps up to ``max_batch`` requests together on ``engine``'s target, drafters and planner.

    max_batch: sequences that share a pass; more requests wait (``waiting``) and join as slots free. Each is a
        sequence of its own (``Model.sequence``); a batch of one runs on the engine's own target and drafters.
    prefill_chunk: the most prompt tokens a joining request feeds per step (None: as the costs allow; 256 when
        ``max_step_seconds`` is None).
    max_step_seconds: the time a step in which other sequences decode may take (None: fixed slices of
        ``prefill_chunk``). A joining prompt's slice is chosen by the measured cost of prompt rows at its positions
        (:class:`PrefillCosts`) so that the step stays within it; with nothing else decoding, a prompt goes in the
        largest whole multiples of the layer kernel's rows (``kernel_rows``) within it, so that a request arriving
        meanwhile waits about as long at most.
    prefill_share: the share of the time a long prompt takes while other sequences decode (0.4: they keep about 60%
        of their rate; slices of whole kernel calls, in the steps the prompt's account allows, ``_prefill_rows``).
        Where a decoding step alone takes more than ``max_step_seconds``, a slice still adds ``FLOOR_SHARE`` of one.
    cache_memory: bytes that the slots' caches may hold (None: ``default_cache_memory()``, a quarter of the
        machine's memory; 0 keeps no finished request's cache): past it the free slots' caches are dropped, least
        recently used first, their memory handed back. Counted from the positions each slot's cache has held
        (``position_bytes``); a model that does not say what a position takes is not bounded.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 8,
        prefill_chunk: int | None = None,
        max_step_seconds: float | None = MAX_STEP_SECONDS,
        prefill_share: float = PREFILL_SHARE,
        cache_memory: int | None = None,
    ) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        if max_step_seconds is not None and not (max_step_seconds > 0 and math.isfinite(max_step_seconds)):
            raise ValueError(f"max_step_seconds must be a number of seconds > 0 (or None), got {max_step_seconds!r}")
        if not 0.0 < prefill_share < 1.0:
            raise ValueError(f"prefill_share must be between 0 and 1 (exclusive), got {prefill_share!r}")
        if cache_memory is None:
            cache_memory = default_cache_memory()
        elif cache_memory < 0:
            raise ValueError(f"cache_memory must be a number of bytes >= 0, got {cache_memory!r}")
        self.engine = engine
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.max_step_seconds = max_step_seconds
        self.prefill_share = prefill_share
        self.cache_memory = cache_memory
        self.costs = PrefillCosts()
        self._credit = 0.0  # seconds the longer prompts may still add to steps beside decoding ones (_learn)
        self._beside = self._long_fed = False  # the step: whether something waited on it; whether a longer prompt fed
        self._slots: list[_Slot] = []
        self._queue: deque[tuple[int, CheckedRequest]] = deque()
        self._next_id = 0
        self._admitted = 0
        self._finished = 0
        self._position_bytes: int | None = None
        self.prefill_fed = 0  # prompt tokens fed to the target
        self.prefill_copied = 0  # prompt tokens copied from another sequence's cache instead (_copy_shared,
        # _share_prefill)
        self.caches_dropped = 0  # free slots' caches dropped to keep within cache_memory
        if max_batch > 1:  # a target or drafter that cannot hold several sequences says so now, not mid-request
            try:
                self._new_slot()
                self._new_slot()
            except NotImplementedError as err:
                raise ValueError(f"cannot batch several requests: {err}; use max_batch 1") from err

    # ---- requests --------------------------------------------------------------------------------------------

    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id. Raises ValueError at once for a bad request (nothing is queued)."""
        checked = self.engine.check_request(request)
        rid = self._next_id
        self._next_id += 1
        self._queue.append((rid, checked))
        return rid

    def cancel(self, rid: int) -> None:
        """Drop request ``rid``: taken out of the queue, or its slot freed at the next step."""
        for i, (queued, _) in enumerate(self._queue):
            if queued == rid:
                del self._queue[i]
                return
        for slot in self._slots:
            if slot.run is not None and slot.rid == rid:
                slot.cancelled = True

    @property
    def running(self) -> int:
        """Requests holding a slot."""
        return sum(slot.run is not None and not slot.cancelled for slot in self._slots)

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        return len(self._queue)

    def has_work(self) -> bool:
        return bool(self._queue) or any(slot.run is not None for slot in self._slots)

    # ---- slots -----------------------------------------------------------------------------------------------

    def _new_slot(self) -> _Slot:
        slot = self._made_slot()
        self._slots.append(slot)
        return slot

    def _made_slot(self) -> _Slot:
        """A slot with an empty cache: a sequence of the target of its own with its drafters forked for it (a batch
        of one: the engine's own target and drafters, which need neither)."""
        engine = self.engine
        if self.max_batch == 1:
            return _Slot(engine.target, engine.planner.new_state(engine.drafters), own=True)
        target = engine.target.sequence()
        drafters = [d.fork(target) for d in engine.drafters]
        return _Slot(target, engine.planner.new_state(drafters))

    def _reusable(self, slot: _Slot, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` ``slot``'s target cache holds from its last finished request (a
        chat's earlier turns, a system prompt every request repeats): as ``Engine``'s prompt caching, exact by the
        Model contract, 0 when anything else wrote the cache since or the request needs features it did not keep.
        The last prompt token is always fed."""
        return kept_prefix(slot.cache, slot.target, slot.state.sources, prompt)

    def _admit(self) -> None:
        """Queued requests into slots: the free slot whose conversation the prompt continues (``CONTINUES``), else
        a slot never used, else a new one while there is room, else the free slot that finished longest ago; so
        each client's chat keeps its cache for its next turn. Any prefix the chosen slot holds is kept, and a longer
        one that another slot holds is copied (``_copy_shared``)."""
        while self._queue:
            rid, req = self._queue[0]
            prompt = req.prompt_ids
            free = [s for s in self._slots if s.run is None]
            kept = {id(s): self._reusable(s, prompt) for s in free}
            # a slot whose cache this prompt continues (a chat's next turn): it shares most of what the slot holds,
            # not only a system prompt every request repeats
            ours = [s for s in free if kept[id(s)] > 0 and kept[id(s)] >= CONTINUES * len(s.cache[0])]
            unused = [s for s in free if s.cache is None]
            if ours:
                slot = max(ours, key=lambda s: kept[id(s)])
            elif unused:
                slot = unused[0]
            elif len(self._slots) < self.max_batch:
                slot = self._new_slot()  # rather than drop a conversation another client may continue
            elif free:
                slot = min(free, key=lambda s: s.finished)  # the conversation left longest ago
            else:
                return
            keep = kept.get(id(slot), 0)  # a new slot holds nothing
            self._queue.popleft()
            self.engine.begin(slot, req, keep)
            slot.rid, slot.cancelled = rid, False
            slot.order, self._admitted = self._admitted, self._admitted + 1
            self._copy_shared(slot, keep)
            slot.written = max(slot.written, slot.target.length)

    def _copy_shared(self, slot: _Slot, keep: int) -> None:
        """Where another slot's cache, running or free, holds a longer prefix of ``slot``'s new prompt than the
        ``keep`` tokens ``slot`` kept (sub-agents sharing their parent's system prompt, a conversation that another
        slot served), copy it (``Model.copy_prefix``: the cache that feeding those tokens writes, so the output is
        unchanged) and count it as cached (``SpecStats.cached_tokens``) and copied (``prefill_copied``). A prefix
        that adds little to what ``slot`` kept is not worth copying whole (``COPY_GAIN``)."""
        target, run = slot.target, slot.run
        if type(target).copy_prefix is Model.copy_prefix:
            return  # a model that cannot copy a cache
        prompt = run.prompt_ids
        best, source = keep, None
        for other in self._slots:
            if other is not slot:
                held = self._holds(other, prompt, target.keep_features)
                if held > best:
                    best, source = held, other
        if source is None or best - keep < max(1, best // COPY_GAIN):
            return
        try:
            target.copy_prefix(source.target, best)
        except (NotImplementedError, ValueError):  # (refused before anything is copied)
            return
        run.copied(best)
        self.prefill_copied += best - keep

    @staticmethod
    def _holds(slot: _Slot, prompt: list[int], features: bool) -> int:
        """How many leading tokens of ``prompt`` (but its last) ``slot``'s cache holds now: of its running request's
        context, as far as its cache has it, or of its last request's (as :func:`kept_prefix` reads it, 0 when
        anything else wrote the cache since); 0 when ``features`` are needed and the cache did not keep them."""
        target, run = slot.target, slot.run
        if run is None:
            if slot.cache is None:
                return 0
            context, feeds, had_features = slot.cache
            if feeds is None or feeds != target.feeds or (features and not had_features):
                return 0
        else:
            if features and not target.keep_features:
                return 0
            context = run.context  # the prompt, then the output: the cache holds its first target.length tokens
        return min(common_prefix(context, prompt, limit=len(prompt) - 1), target.length)

    def _release(self, slot: _Slot) -> None:
        slot.run, slot.cancelled = None, False

    def _share_prefill(self, active: list[_Slot]) -> list[_Slot]:
        """Requests with one prompt (a request's ``n`` choices) prefill it once: a sequence yet to begin its prefill
        copies the cache of one that has done the same prompt (``Model.copy_prefix``), or waits, putting no rows
        in the pass, while an earlier one is doing it. Returns the sequences that put rows in this step's pass.

        A row's result does not depend on what shares its pass, so the copied cache is the one the sequence would
        have written: each request's output is unchanged. (Where a slot's own cache kept part of the prompt, the
        copy replaces it with the same positions.)"""
        out = []
        for slot in active:
            rest = slot.run.prefill_tokens()
            if slot.prefill_at or not rest or type(slot.target).copy_prefix is Model.copy_prefix:
                out.append(slot)  # begun, nothing to prefill, or a model that cannot copy a cache
                continue
            prompt = slot.run.prompt_ids[:-1]
            same = [
                other
                for other in active
                if other is not slot and other.order < slot.order and other.run.prompt_ids[:-1] == prompt
            ]
            done = next((other for other in same if other.prefill_at >= len(other.run.prefill_tokens())), None)
            if done is not None:
                try:
                    slot.target.copy_prefix(done.target, len(prompt))
                except NotImplementedError:
                    out.append(slot)  # this model cannot: the request prefills its own
                    continue
                slot.prefill_at = len(rest)
                self.prefill_copied += len(rest)
                slot.run.prefilled()
                out.append(slot)
            elif not same:
                out.append(slot)
            # else: an earlier request is prefilling this prompt; wait for it
        return out

    # ---- a step ----------------------------------------------------------------------------------------------

    def step(self) -> BatchStep:
        """Admit what fits, then one target pass for every running request (``Engine.step``), a joining prompt's
        slice in it chosen by what it costs (``_slices``). Returns the events it made."""
        for slot in self._slots:
            if slot.cancelled:
                self._release(slot)
        copied = self.prefill_copied
        self._admit()
        active = [s for s in self._slots if s.run is not None]
        if not active:
            return BatchStep([])
        active = self._share_prefill(active)
        limits = self._slices(active)
        fed = [(slot, limit) for slot, limit in zip(active, limits) if limit != 0]
        slots = [slot for slot, _ in fed]
        began = [(slot, slot.prefill_at, slot.target.length) for slot, limit in fed if limit is not None]
        out = self.engine.step(slots, [limit for _, limit in fed])
        self._learn(out, began, decoding=len(began) < len(fed))
        out.prefill_copied = self.prefill_copied - copied
        self.prefill_fed += out.prefill_fed
        for slot in slots:
            slot.written = max(slot.written, slot.target.length)
            finish = slot.run.finish
            if finish is not None:
                if finish != "error":
                    slot.finished, self._finished = self._finished, self._finished + 1
                self._release(slot)
        self._trim_memory()
        return out

    def _learn(self, out: BatchStep, began: list[tuple[_Slot, int, int]], decoding: bool) -> None:
        """Tell the costs what the step did (how long it took, the prompt rows it fed: ``began``, the prompts' slots
        with where their prefill and their cache stood; whether sequences decoded beside them), and keep the long
        prompts' account beside decoding sequences (``_credit``)."""
        rows, weighted = 0, 0.0
        for slot, at, position in began:
            n = slot.prefill_at - at
            rows += n
            weighted += n * (position + 0.5 * n)
        spent = self.costs.decode
        if rows:
            self.costs.observe_prefill(rows, weighted / rows, out.seconds, decoding)
        elif decoding and out.sequences:
            self.costs.observe_decode(out.seconds)
        if not self._beside:
            self._credit = 0.0  # nothing waits on the step: the account starts anew when something does
            return
        ratio = self.prefill_share / (1.0 - self.prefill_share)
        if self._long_fed and spent is not None:  # a decoding step's time, and what the prompt's slice added to it
            self._credit += ratio * spent - max(out.seconds - spent, 0.0)
        else:
            self._credit += ratio * out.seconds
        self._credit = min(self._credit, max(self.max_step_seconds or 0.0, spent or 0.0))

    def _slices(self, active: list[_Slot]) -> list[int | None]:
        """Per slot of the pass, the most prompt tokens it feeds this step: None for one that decodes, 0 for a
        prompt that waits this step (see ``_prefill_rows``)."""
        self._beside = self._long_fed = False
        rests: dict[int, int] = {}
        for slot in active:
            run = slot.run
            if not run.prefill_done:
                rest = max(len(run.prompt_ids) - 1 - run.cached, 0) - slot.prefill_at
                if rest > 0:
                    rests[id(slot)] = rest
        self._beside = len(rests) < len(active)
        if not rests:
            return [None] * len(active)
        if self.max_step_seconds is None:
            chunk = self.prefill_chunk or PREFILL_CHUNK
            return [chunk if id(s) in rests else None for s in active]
        decoding = len(active) - len(rests)
        rows = self._prefill_rows([s for s in active if id(s) in rests], rests, decoding)
        return [rows[id(s)] if id(s) in rests else None for s in active]

    def _prefill_rows(self, prompts: list[_Slot], rests: dict[int, int], decoding: int) -> dict[int, int]:
        """The rows each of ``prompts`` (slots with ``rests`` prompt tokens to feed) feeds this step, beside
        ``decoding`` decoding sequences.

        A prompt that one call of the layer kernel takes whole (a client's next question, a short turn) goes in whole
        where its estimated cost fits in ``max_step_seconds`` (not the last rows of a long prompt, whose rows deep in it
        cost several times one near its start), and a reply waits on it as on a decoding sequence. Where none waits, the
        longer prompts (the shortest first) take ``max_step_seconds`` as the measured costs (:class:`PrefillCosts`) say,
        in whole calls of the kernel where that is one or more. Beside ones that wait, the shortest longer prompt feeds
        a slice that keeps the step within the budget (whole calls where they fit: a row costs several times less in a
        call of 64 than in one of a few), in the steps its account allows: it gains ``prefill_share / (1 -
        prefill_share)`` of each decoding step's time and pays what its slices add to the steps, so that over time the
        decoding sequences keep at least ``1 - prefill_share`` of their rate. Every ``REFRESH`` steps that fed one, and
        before the decoding step was measured, no longer prompt is fed (the decoding step is measured).
        In every pass the rows end at a multiple of the kernel's rows where they pass one."""
        costs, budget, call, cap = self.costs, self.max_step_seconds, kernel_rows(), self.prefill_chunk
        order = sorted(prompts, key=lambda s: (rests[id(s)], s.order))  # the shortest first: its reply waits
        out = {id(s): min(rests[id(s)], cap or call) for s in order if self._whole(s, rests[id(s)], decoding > 0)}
        longer = [s for s in order if id(s) not in out]
        for slot in longer:
            out[id(slot)] = 0
        if not longer:
            return out
        fixed = decoding + sum(out.values())  # the rows of the pass besides the longer prompts'
        if decoding or fixed:
            self._beside = True
            spent = costs.decode
            if spent is None or costs.since_decode >= REFRESH:
                return out
            room = max(budget - spent, FLOOR_SHARE * spent)  # what a slice may add to a decoding step
            for slot in order:
                n = out[id(slot)]
                if n:
                    room -= n * (costs.row_seconds(slot.target.length + 0.5 * n, True) or 0.0)
            slot = longer[0]
            n = self._slice(slot, rests[id(slot)], room, fixed, True)
            need = n * (costs.row_seconds(slot.target.length + 0.5 * n, True) or 0.0)
            ratio = self.prefill_share / (1.0 - self.prefill_share)
            if self._credit + ratio * spent < min(need, max(budget, spent)):
                return out  # the slice waits for the decoding steps that pay for it
            out[id(slot)] = n
            self._long_fed = True
            return out
        left = budget
        for i, slot in enumerate(longer):
            n = self._slice(slot, rests[id(slot)], left, fixed, False, least=1 if i == 0 else 0)
            fixed += n
            per_row = costs.row_seconds(slot.target.length + 0.5 * n, False)
            left = left - n * per_row if per_row is not None else 0.0
            out[id(slot)] = n
        return out

    def _whole(self, slot: _Slot, rest: int, beside: bool) -> bool:
        """Whether ``slot``'s prompt (``rest`` rows left) goes in whole this step: one call of the layer kernel
        takes it, and its estimated cost (none yet: taken as fitting) fits in ``max_step_seconds``."""
        if rest > kernel_rows():
            return False
        per_row = self.costs.row_seconds(slot.target.length + 0.5 * rest, beside)
        return per_row is None or rest * per_row <= self.max_step_seconds

    def _slice(self, slot: _Slot, rest: int, seconds: float, fixed: int, beside: bool, least: int = 1) -> int:
        """The rows of ``slot``'s prompt (``rest`` left) whose estimated cost fits in ``seconds`` (the first slice
        before anything was measured), at least ``least``; the pass's rows (``fixed`` of others besides) ending at
        a multiple of the kernel's rows where they pass one."""
        n = self.costs.rows_within(seconds, slot.target.length, rest, beside)
        if n is None:
            n = PrefillCosts.FIRST_ROWS
        n = min(max(n, least), rest, self.prefill_chunk or rest)
        call = kernel_rows()
        total = fixed + n
        if total > call and total % call < n:
            n -= total % call
        return n

    def _trim_memory(self) -> None:
        """Keep the slots' caches within ``cache_memory``: past it, the free slots' caches are dropped, the least
        recently used first (a slot dropped is made anew, its sequence's memory handed back)."""
        budget = self.cache_memory
        if budget is None:
            return
        if self._position_bytes is None:
            self._position_bytes = position_bytes(self._slots[0].target) if self._slots else None
            if self._position_bytes is None:
                return
        per = self._position_bytes
        held = per * sum(slot.written for slot in self._slots)
        if held <= budget:
            return
        kept = [s for s in self._slots if s.run is None and s.written and not s.own]
        for slot in sorted(kept, key=lambda s: s.finished):
            held -= per * slot.written
            self._slots[self._slots.index(slot)] = self._made_slot()
            self.caches_dropped += 1
            if held <= budget:
                return

    @property
    def cache_bytes(self) -> int | None:
        """Bytes the slots' caches hold (as ``cache_memory`` counts them; None for a model that does not say)."""
        per = position_bytes(self._slots[0].target) if self._slots else None
        return None if per is None else per * sum(slot.written for slot in self._slots)

    def run_all(self, requests: Iterable[Request]) -> list[list[GenerationEvent]]:
        """Submit ``requests`` and step until all are done; each request's events in order (a convenience for
        tests and benchmarks)."""
        ids = [self.submit(r) for r in requests]
        out: dict[int, list[GenerationEvent]] = {rid: [] for rid in ids}
        while self.has_work():
            step = self.step()
            if step.errors:
                raise step.errors[0][1]
            for rid, event in step.events:
                out[rid].append(event)
        return [out[rid] for rid in ids]
