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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from specwise.engine import Engine, GenerationEvent, kept_prefix
from specwise.models.base import Model
from specwise.step import BatchStep, CheckedRequest, Request, Slot

__all__ = ["BatchEngine", "BatchStep", "Request"]


@dataclass
class _Slot(Slot):
    """A slot of the batch, reused by request after request: the engine's :class:`~specwise.engine.Slot` with
    what the batch's scheduling keeps of it."""

    cancelled: bool = False
    order: int = 0  # when its request was admitted (the earliest of several with one prompt prefills it)
    finished: int = -1  # when its last request finished (a count of finished requests; -1: none)


# A request continues a free slot's conversation when the prefix its prompt shares with the slot's cache is at least
# this share of what the cache holds (a chat's next turn shares all of it; another chat only the system prompt)
CONTINUES = 0.5


class BatchEngine:
    """Steps up to ``max_batch`` requests together on ``engine``'s target, drafters and planner.

    max_batch: sequences that share a pass; more requests wait (``waiting``) and join as slots free.
    prefill_chunk: prompt tokens a joining request feeds per step (longer prompts take several steps), so that
        a long prompt delays the others' next tokens by a bounded amount.
    """

    def __init__(self, engine: Engine, max_batch: int = 8, prefill_chunk: int = 256) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.engine = engine
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self._slots: list[_Slot] = []
        self._queue: deque[tuple[int, CheckedRequest]] = deque()
        self._next_id = 0
        self._admitted = 0
        self._finished = 0
        self.prefill_fed = 0  # prompt tokens fed to the target
        self.prefill_copied = 0  # prompt tokens copied from another sequence's cache instead (see _share_prefill)
        if max_batch > 1:  # a target or drafter that cannot hold several sequences says so now, not mid-request
            self._new_slot()
            try:
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
        engine = self.engine
        if not self._slots:  # the engine's own sequence and drafters serve the first slot
            target, drafters = engine.target, engine.drafters
        else:
            target = engine.target.sequence()
            drafters = [d.fork(target) for d in engine.drafters]
        slot = _Slot(target, engine.planner.new_state(drafters))
        self._slots.append(slot)
        return slot

    def _reusable(self, slot: _Slot, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` ``slot``'s target cache holds from its last finished request (a
        chat's earlier turns, a system prompt every request repeats): as ``Engine``'s prompt caching, exact by the
        Model contract, 0 when anything else wrote the cache since or the request needs features it did not keep.
        The last prompt token is always fed."""
        return kept_prefix(slot.cache, slot.target, slot.state.sources, prompt)

    def _admit(self) -> None:
        """Queued requests into slots: the free slot whose conversation the prompt continues (``CONTINUES``), else
        a slot never used, else a new one while there is room, else the free slot that finished longest ago; so
        each client's chat keeps its cache for its next turn. Any prefix the chosen slot holds is kept."""
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
        """Admit what fits, then one target pass for every running request (``Engine.step``). Returns the events
        it made."""
        for slot in self._slots:
            if slot.cancelled:
                self._release(slot)
        self._admit()
        active = [s for s in self._slots if s.run is not None]
        if not active:
            return BatchStep([])
        copied = self.prefill_copied
        active = self._share_prefill(active)
        out = self.engine.step(active, self.prefill_chunk)
        out.prefill_copied = self.prefill_copied - copied
        self.prefill_fed += out.prefill_fed
        for slot in active:
            finish = slot.run.finish
            if finish is not None:
                if finish != "error":
                    slot.finished, self._finished = self._finished, self._finished + 1
                self._release(slot)
        return out

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
