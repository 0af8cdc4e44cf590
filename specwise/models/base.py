"""The Model contract: a causal LM with a KV cache that can be rolled back; and the optional abilities some models
have, as protocols the callers ask for by type (``isinstance(model, OutputRows)``), never by probing attributes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from specwise.models.threads import ThreadGovernor

__all__ = [
    "CacheArrays",
    "Model",
    "OutputRows",
    "PassThreads",
    "QuantizedWeights",
    "ReusableRows",
    "TargetLayers",
    "TokenIds",
    "WeightRows",
    "token_ids",
]

TokenIds = np.ndarray | Sequence[int]  # what forward takes: anything np.asarray(x, dtype=np.int64) accepts


@dataclass(frozen=True)
class PassThreads:
    """The thread count of a model's passes: the count they run on (between tries of the other count) and the one
    the last pass ran on (None before the first)."""

    in_use: int
    last: int | None


@runtime_checkable
class QuantizedWeights(Protocol):
    """A model that runs a GGUF file's weights in their own block formats on the CPU (the quantized native model)."""

    path: Path  # the GGUF file
    precision: str  # how its activations are evaluated: "q8" or "exact"


@runtime_checkable
class OutputRows(Protocol):
    """A model whose output layer's rows can be read and kept apart (the quantized native model): a draft model over
    a draft vocabulary (``restrict_output``), the `self` drafter's passes over some rows (``read_output_rows``,
    ``output_rows``, ``forward_last``), and what the layer weighs against the whole (``lm_head``,
    ``weight_bytes``)."""

    lm_head: Any  # the output layer (its ``nbytes``: what a pass reads of it)

    @property
    def weight_bytes(self) -> int: ...

    def read_output_rows(self, ids) -> Any: ...

    def restrict_output(self, ids) -> None: ...

    def output_rows(self, rows) -> tuple: ...

    def forward_last(self, tokens: TokenIds, output: tuple) -> np.ndarray: ...


@runtime_checkable
class ReusableRows(Protocol):
    """A model whose cache keeps the rows fed past a rollback and finds them again (the quantized native model with
    features kept): a pass over tokens a drafting pass already fed computes only the rest."""

    def reusable(self, tokens: np.ndarray) -> int: ...


@runtime_checkable
class CacheArrays(Protocol):
    """A model whose cache is two arrays of keys and values laid out ``[layers, kv heads, capacity, head dim]`` (the
    native models; numpy arrays or torch tensors): what one position takes is read from them."""

    k_cache: Any
    v_cache: Any


@runtime_checkable
class WeightRows(Protocol):
    """A weight matrix ``[rows, columns]`` read a few rows at a time as float32, never expanded whole: a target's
    embedding or output layer as a drafter reads it (a GGUF file's tensor read from its blocks, a torch tensor read
    back to the host)."""

    shape: tuple[int, ...]

    def rows(self, ids) -> np.ndarray:
        """Rows ``ids`` (integers) as float32 ``[len(ids), columns]``."""
        ...

    def row(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """Row ``index`` as float32 ``[columns]``, into ``out`` when given."""
        ...


@runtime_checkable
class TargetLayers(Protocol):
    """What a drafter trained on a target's features reads of the target, and what tells its weights apart (the head
    drafter; a trained head and a suffix index record it): its embedding and output layer as rows, its architecture,
    its hidden size and number of layers, and a fingerprint of its output layer (the mean absolute value of
    ``chunks`` equal slices of the flattened weight). A quantized target's is ``models.quantized.TargetWeights``, a
    Hugging Face module's ``models.target_layers.HFTargetLayers``; ``models.target_layers.target_layers`` gives
    either."""

    architecture: str
    hidden_size: int
    num_layers: int
    embedding: WeightRows
    output: WeightRows

    def fingerprint(self, chunks: int = 16) -> list[float]: ...


class Model(ABC):
    """A causal language model holding one sequence in its cache.

    ``forward`` appends tokens to the cache and returns logits; ``rollback`` rewinds the cache to a length.
    Implementations must make ``rollback(n)`` followed by ``forward(tokens)`` give the same logits as if the
    rolled-back tokens had never been fed.
    """

    vocab_size: int
    device: str  # "cpu", or where a torch-based model runs ("cuda:0")
    max_length: int | None = None  # the longest sequence the model supports, when known
    keep_features: bool = False  # keep the last hidden states of cached positions (``features``,
    # ``set_keep_features``)
    governor: ThreadGovernor | None = None  # chooses the thread count of each pass (the native models; None: the
    # model's passes use what their library decides): read through ``pass_threads``
    feeds: int | None = None  # passes and copies that wrote the cache (None: never written): who reuses a cache
    # across requests checks that nobody else wrote it in between

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens in the cache."""

    @abstractmethod
    def forward(self, tokens: TokenIds, num_logits: int | None = None) -> np.ndarray:
        """Append ``tokens`` ``[k]`` (token ids: an int array or a list of ints) at positions
        ``length .. length + k - 1``.

        Returns float32 logits ``[n, vocab]`` (a C-contiguous numpy array) for the last ``n = num_logits`` positions
        (all ``k`` when None; 0 returns an empty array and may skip the output layer). Logit row i predicts the
        token after input i.
        """

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Discard everything after the first ``length`` cached tokens."""

    def discard_past_length(self) -> None:
        """Forget what a rollback left past the length (a model that reuses it, ``QuantizedModel.reusable``, then
        computes every position fed from here): a new request starts from this, so that its passes do the work its
        tokens need, not an earlier request's. Models that keep nothing past the length do nothing."""

    def reserve(self, length: int) -> None:
        """Room in the cache for ``length`` positions before a long prompt is fed in slices, so that the cache does
        not grow (and copy what it holds) on the way, in the middle of a prompt's reading. A hint: models whose cache
        grows cheaply, or not at all, ignore it."""

    def sequence(self) -> Model:
        """Another sequence over the same weights, with its own empty cache: what a batch of sequences sharing
        target passes is made of (see :meth:`forward_batch`)."""
        raise NotImplementedError(f"{type(self).__name__} holds one sequence only")

    def copy_prefix(self, source: Model, length: int) -> None:
        """Make this sequence's cache the first ``length`` positions of ``source``'s (another sequence of this
        model, from :meth:`sequence`): a prompt prefilled once serves several sequences (a batch's ``n`` choices).
        Features come too when this sequence keeps them. Raises NotImplementedError where the model cannot (the
        caller then feeds the tokens itself)."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy another sequence's cache")

    def _check_copy_prefix(self, source: Model, same_weights: bool, length: int) -> None:
        self.feeds = (self.feeds or 0) + 1
        if type(source) is not type(self) or not same_weights:
            raise ValueError("copy_prefix takes another sequence of the same model (made by sequence())")
        if not 0 <= length <= source.length:
            raise ValueError(f"cannot copy {length} positions: the source's cache holds {source.length} tokens")
        if self.keep_features and length and not source.keep_features:
            raise ValueError("the source kept no features: set_keep_features(True) on both sequences before feeding")

    def set_keep_features(self, keep: bool) -> None:
        """Keep (True) or stop keeping the last hidden states of the positions fed from now on (``features``): a
        drafter that reads the target's features (the trained head) needs them."""
        self.keep_features = bool(keep)

    def pass_threads(self) -> PassThreads | None:
        """The thread count of this model's passes (its ``governor``'s choice), for a planner that estimates the cost
        of a pass per thread count; None where the model does not choose it."""
        governor = self.governor
        return None if governor is None else PassThreads(governor.in_use(), governor.last)

    def fix_threads(self, fixed: bool) -> None:
        """Run every pass on all the threads the process may use (True), or let the governor choose each pass's
        count (False: the default, unless ``SPECWISE_THREADS=fixed``). A model without a governor ignores it."""
        if self.governor is not None:
            self.governor.set_fixed(fixed)

    def forward_batch(
        self, items: list[tuple[Model, TokenIds]], num_logits: list[int | None] | None = None
    ) -> list[np.ndarray]:
        """``seq.forward(tokens, n)`` for each ``(seq, tokens)`` (sequences of this model: itself or made by
        :meth:`sequence`), in one pass where the implementation can (each weight read once for every row). Each
        result equals what the sequence's own forward would give; this default runs them one after another."""
        keeps = list(num_logits) if num_logits is not None else [None] * len(items)
        if len(keeps) != len(items):
            raise ValueError(f"{len(items)} sequences need {len(items)} num_logits, got {len(keeps)}")
        return [seq.forward(tokens, keep) for (seq, tokens), keep in zip(items, keeps)]

    def features(self, start: int, end: int) -> np.ndarray:
        """The last hidden states (after the final norm: the output layer's input) at cached positions
        ``start .. end - 1``, as float32 ``[end - start, hidden]``. Needs ``keep_features = True`` before those
        positions were fed (``set_keep_features``; the engine asks for it when a drafter reads the features)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its hidden states")

    def _check_features(self, start: int, end: int) -> None:
        if not self.keep_features:
            raise RuntimeError("features were not kept: call set_keep_features(True) before feeding tokens")
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"features [{start}, {end}) outside the cache of {self.length} tokens")

    def reset(self) -> None:
        """Empty the cache."""
        self.rollback(0)

    def _check_forward(self, tokens: TokenIds) -> np.ndarray:
        """Count a pass and check its tokens: a non-empty 1-D sequence of integer ids that fits the context.
        Returns them as an int64 array (the same array when ``tokens`` already is one)."""
        self.feeds = (self.feeds or 0) + 1
        ids = token_ids(tokens)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"forward takes a non-empty 1-D sequence of token ids, got shape {ids.shape}")
        if self.max_length is not None and self.length + ids.size > self.max_length:
            raise ValueError(
                f"sequence of {self.length + ids.size} tokens exceeds the model's context of "
                f"{self.max_length}: shorten the prompt or lower max_new_tokens"
            )
        return ids

    def _check_rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the cache holds {self.length} tokens")


def token_ids(tokens: TokenIds) -> np.ndarray:
    """``tokens`` as an int64 array of their shape (no copy when they are one already). Raises TypeError for
    values that are not integers (floats would be truncated silently)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int64:
        return tokens
    ids = np.asarray(tokens)
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got {ids.dtype}")
    return ids.astype(np.int64, copy=False)
