"""Constrained decoding: a grammar (JSON schema, JSON object, Lark grammar or regex) that forbids tokens.

A constraint is a transform of the distribution, like temperature or top-p, applied identically to the target's
``p`` and the drafter's ``q``: the tokens the grammar forbids after the text so far get probability 0 (logits
-inf, before the sampling transforms). The grammar engine is llguidance (``pip install specwise[constrained]``);
its matcher advances with the emitted tokens and rolls back when drafted tokens are rejected:

- the masks for verifying a draft of ``k`` tokens are those after each prefix of the draft (:meth:`GrammarState.
  draft_masks`: consume the draft, take each mask, roll the matcher back);
- after verification the matcher consumes the emitted tokens (:meth:`GrammarState.advance`);
- when the grammar can take no further token the output is complete (:attr:`GrammarState.done`).

Usage::

    params = SamplingParams(temperature=0.0, constraint=JsonSchema({"type": "object", ...}))
"""

from __future__ import annotations

import json
import threading
import time
from decimal import Decimal

import numpy as np

from specwise.grammars import (
    Constraint,
    ConstraintError,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
    _llguidance,
)
from specwise.sampling import sample

__all__ = [
    "Constraint",
    "JsonSchema",
    "JsonObject",
    "Grammar",
    "Regex",
    "GrammarState",
    "ConstraintError",
    "grammar_tokenizer",
    "max_json_bytes",
]


_TOKENIZERS: dict[object, object] = {}
_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer, vocab_size: int | None = None, eos: int | None = None):
    """llguidance's tokenizer for ``tokenizer`` (built once, ~0.3 s, and cached): an ``llguidance.LLTokenizer`` as
    it is, specwise's LightTokenizer (its ``tokenizer.json``), a Hugging Face fast tokenizer or a ``tokenizers``
    Tokenizer."""
    llg = _llguidance()
    if isinstance(tokenizer, llg.LLTokenizer):
        return tokenizer
    key = (id(tokenizer), vocab_size, eos)
    with _LOCK:
        hit = _TOKENIZERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        if eos is None:
            eos = getattr(tokenizer, "eos_token_id", None)
        directory = getattr(tokenizer, "directory", None)
        if directory is not None and (directory / "tokenizer.json").is_file():
            text = (directory / "tokenizer.json").read_text(encoding="utf-8")
        elif hasattr(tokenizer, "backend_tokenizer"):
            text = tokenizer.backend_tokenizer.to_str()
        elif hasattr(tokenizer, "to_str"):
            text = tokenizer.to_str()
        else:
            raise ConstraintError(
                f"constrained decoding needs a Hugging Face (fast) tokenizer; got {type(tokenizer).__name__}"
            )
        built = llg.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
        _TOKENIZERS[key] = (tokenizer, built)
        return built


class GrammarState:
    """One request's grammar matcher: masks over the model's vocabulary, advanced and rolled back with the output.

    vocab_size: the model's vocabulary (ids the grammar tokenizer does not have are always forbidden).
    eos: the request's end tokens; they are allowed exactly when the grammar is complete.
    """

    def __init__(self, constraint: Constraint, tokenizer, vocab_size: int, eos: set[int]) -> None:
        llg = _llguidance()
        self.tokenizer = grammar_tokenizer(tokenizer)
        self.vocab_size = vocab_size
        self.eos = sorted(t for t in eos if 0 <= t < vocab_size)
        self.matcher = llg.LLMatcher(self.tokenizer, constraint.grammar(), log_level=0)
        if self.matcher.is_error():
            first = self.matcher.get_error().strip().splitlines()[0]
            raise ConstraintError(f"invalid {constraint.kind}: {first}")
        words = (self.tokenizer.vocab_size + 31) // 32
        self._bits = np.zeros(words, dtype=np.uint32)  # llguidance writes the mask here, a bit per token
        self.mask_seconds = 0.0  # time spent computing masks (reported by the benchmark)
        self.masks = 0  # masks computed (each state's once: see _known)
        # the masks computed since the last advance, by the tokens consumed since then (the drafts' prefixes): a
        # state's mask is computed once, whether a draft's verification or the next step asks for it
        self._path: list[int] = []
        self._known: dict[tuple[int, ...], np.ndarray] = {}

    def mask(self) -> np.ndarray:
        """Allowed tokens after the text so far: bool ``[vocab_size]`` (computed once per state; shared, read-only)."""
        key = tuple(self._path)
        hit = self._known.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little").view(np.bool_)  # [32 * words]
        n = min(self.vocab_size, allowed.size)
        out = np.zeros(self.vocab_size, dtype=np.bool_)
        out[:n] = allowed[:n]
        if self.eos:  # the request's end tokens end the output exactly when the grammar is complete
            out[self.eos] = self.matcher.is_accepting()
        if not out.any():
            raise RuntimeError(f"the grammar allows no token here: {self.matcher.get_error() or 'dead end'}")
        out.flags.writeable = False  # known masks are shared by every caller that asks for the state
        self.mask_seconds += time.perf_counter() - t0
        self.masks += 1
        self._known[key] = out
        return out

    def _consume(self, token: int) -> bool:
        """Consume ``token`` if the grammar allows it here (the caller checked the mask); end tokens are not fed."""
        if token in self.eos:
            return False
        if not self.matcher.consume_token(token):
            return False
        self._path.append(token)
        return True

    def _rollback(self, count: int) -> None:
        """Undo the last ``count`` tokens consumed (their masks stay known)."""
        if count:
            self.matcher.rollback(count)
            del self._path[len(self._path) - count :]

    def draft_masks(self, tokens: list[int]) -> tuple[np.ndarray, int]:
        """Masks ``[n + 1, vocab_size]`` for verifying ``tokens``: row i is the mask after tokens ``0 .. i-1``.

        n is the number of leading tokens the grammar allows (an end token counts, and stops there): the draft
        is cut to them. The matcher is left as it was.
        """
        rows = [self.mask()]
        consumed = n = 0
        for token in tokens:
            if not bool(rows[-1][token]):
                break
            n += 1
            if not self._consume(token):
                break  # an end token: nothing follows it
            consumed += 1
            rows.append(self.mask())
        self._rollback(consumed)
        while len(rows) < n + 1:
            rows.append(rows[-1])  # after an end token: never used (generation stops there)
        return np.stack(rows), n

    def sampled_draft(
        self, tokens: list[int], probs: np.ndarray, generator: np.random.Generator | None
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """A sampled draft made to follow q with the grammar's masks: (tokens, q ``[n, vocab]``, masks
        ``[n + 1, vocab]``).

        Token i was drawn from q_i; q'_i = norm(q_i * mask_i). A token the grammar allows is a draw from q'_i as it
        is; a forbidden one is replaced by a draw from q'_i (so token i follows q'_i either way) and the draft
        ends after it (the drafter's later tokens continued the forbidden one). Where q_i has no mass the grammar
        allows, the draft ends before i. The matcher is left as it was.
        """
        out: list[int] = []
        rows: list[np.ndarray] = []
        masks = [self.mask()]
        consumed = 0
        for i, token in enumerate(tokens):
            allowed = masks[-1]
            q = constrain_probs(probs[i], allowed)
            if not bool(q.sum() > 0):
                break
            replaced = not bool(allowed[token])
            if replaced:
                token = int(sample(q, generator))
            out.append(token)
            rows.append(q)
            if not self._consume(token):
                masks.append(masks[-1])  # an end token: nothing follows it
                break
            consumed += 1
            masks.append(self.mask())
            if replaced:
                break
        self._rollback(consumed)
        q_out = np.stack(rows) if rows else probs[:0]
        return out, q_out, np.stack(masks)

    def advance(self, tokens: list[int]) -> None:
        """Consume emitted tokens (each one the grammar allowed); the masks known for states past them are kept."""
        for token in tokens:
            if token in self.eos:
                break
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"an emitted token broke the grammar: {self.matcher.get_error()}")
            self._path.append(token)
        done = len(self._path)
        if done:  # the states now reachable start at the current one: re-key their masks from it
            head = tuple(self._path)
            self._known = {key[done:]: mask for key, mask in self._known.items() if key[:done] == head}
            self._path = []

    def forced(self, limit: int) -> list[int]:
        """Consume and return up to ``limit`` tokens that the grammar forces next (each the only token its mask
        allows, so p and q are one-hot on it whatever the models say): jump-forward, exact."""
        out: list[int] = []
        while len(out) < limit and not self.matcher.is_accepting():
            allowed = self.mask()
            if int(allowed.sum()) != 1:
                break
            token = int(np.flatnonzero(allowed)[0])
            if not self._consume(token):
                break
            out.append(token)
        return out

    @property
    def done(self) -> bool:
        """True when the grammar allows nothing but an end token (the output is complete). Decided from the mask
        (which the next step needs anyway), not from the matcher's stopped flag, which it sets only once a mask
        is computed: the answer must not depend on where the steps fell."""
        if self.matcher.is_stopped():
            return True
        if not self.matcher.is_accepting():
            return False
        others = self.mask().copy()
        others[self.eos] = False
        ends = [t for t in self.tokenizer.eos_tokens if 0 <= t < self.vocab_size]
        others[ends] = False
        return not bool(others.any())


def constrain_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``logits`` ``[..., vocab]`` with the forbidden tokens (``allowed`` False, bool ``[vocab]`` or of the logits'
    shape) at -inf: a new array of the logits' dtype."""
    logits = np.asarray(logits)
    return np.where(allowed, logits, logits.dtype.type(-np.inf))


def constrain_probs(probs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``probs`` ``[..., vocab]`` with the forbidden tokens at 0, renormalised (rows left with no mass are 0)."""
    kept = np.where(allowed, probs, probs.dtype.type(0))
    mass = kept.sum(axis=-1, keepdims=True)
    return np.where(mass > 0, kept / np.maximum(mass, probs.dtype.type(1e-30)), kept)


_ESCAPED = 6  # the most bytes one character of a JSON string takes (an escape, \\uXXXX)


def max_json_bytes(schema: dict | str, _root: dict | None = None) -> int | None:
    """The most bytes a JSON value matching ``schema`` takes in the default layout (``json.dumps``'s: ``", "`` and
    ``": "``), or None when it has no bound: a string without ``maxLength``, an array without ``maxItems``, a
    number without ``minimum`` and ``maximum`` (and, for ``number``, a ``multipleOf``: otherwise its fraction may
    run on, 0.3333...), an object that allows other properties, or a keyword this bound does not know.

    A token is at least one byte, so a request whose ``max_new_tokens`` is at least this bound always ends with a
    complete answer (``finish_reason`` "stop"); with fewer tokens a long answer may end at the limit ("length").
    """
    if isinstance(schema, str):
        schema = json.loads(schema)
    root = schema if _root is None else _root
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        ref = schema["$ref"]
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                target = root.get(prefix[2:-1], {}).get(ref[len(prefix) :])
                return None if target is None else max_json_bytes(target, root)
        return None
    if "const" in schema:
        return len(json.dumps(schema["const"]))
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            bounds = [max_json_bytes(s, root) for s in schema[key]]
            return None if None in bounds or not bounds else max(bounds)
    kind = schema.get("type")
    if isinstance(kind, list):
        bounds = [max_json_bytes({**schema, "type": t}, root) for t in kind]
        return None if None in bounds or not bounds else max(bounds)
    if kind == "null":
        return 4
    if kind == "boolean":
        return 5
    if kind == "string":
        return 2 + _ESCAPED * schema["maxLength"] if "maxLength" in schema else None
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is None or high is None:
            return None
        whole = max(len(str(abs(int(low)))), len(str(abs(int(high))))) + (1 if low < 0 else 0)
        if kind == "integer":
            return whole
        step = schema.get("multipleOf")
        if step is None:
            return None
        places = max(0, -Decimal(str(step)).as_tuple().exponent)
        return whole + (1 + places if places else 0)
    if kind == "array":
        if "maxItems" not in schema:
            return None
        n = schema["maxItems"]
        item = max_json_bytes(schema.get("items", {}), root) if n else 0
        return None if item is None else 2 + n * item + 2 * max(0, n - 1)
    if kind == "object":
        if schema.get("additionalProperties", True) is not False:
            return None
        parts = [max_json_bytes(v, root) for v in schema.get("properties", {}).values()]
        if None in parts:
            return None
        keys = [len(json.dumps(k)) + 2 for k in schema.get("properties", {})]
        return 2 + sum(keys) + sum(parts) + 2 * max(0, len(parts) - 1)
    return None
