"""A tiny table-driven model for tests and simulations.

The logits for the token after position i are ``table[i % periods, token_i]``: the distribution depends on the
context, so exact joint distributions of short continuations can be computed by enumeration.
"""

from __future__ import annotations

import numpy as np

from specwise.models.base import Model, TokenIds

__all__ = ["ToyModel"]


class ToyModel(Model):
    """A Model whose next-token logits are looked up from a table ``[periods, vocab, vocab]`` (any array of floats;
    kept as float32)."""

    def __init__(self, table: np.ndarray, max_length: int | None = None) -> None:
        table = np.ascontiguousarray(table, dtype=np.float32)
        if table.ndim != 3 or table.shape[1] != table.shape[2]:
            raise ValueError(f"table must be [periods, vocab, vocab], got {tuple(table.shape)}")
        self.table = table
        self.vocab_size = table.shape[-1]
        self.device = "cpu"
        self.max_length = max_length
        self.tokens: list[int] = []
        self.passes = 0

    @classmethod
    def random(cls, vocab: int, periods: int = 3, scale: float = 2.0, seed: int = 0, **kw) -> ToyModel:
        """Standard normal logits times ``scale``, drawn from a numpy Philox generator seeded with ``seed`` (the same
        table on every machine)."""
        gen = np.random.Generator(np.random.Philox(seed))
        return cls(gen.standard_normal((periods, vocab, vocab), dtype=np.float32) * np.float32(scale), **kw)

    def sequence(self) -> ToyModel:
        """Another sequence over the same table (shared, not copied), with no tokens."""
        return ToyModel(self.table, self.max_length)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def copy_prefix(self, source: Model, length: int) -> None:
        self._check_copy_prefix(source, getattr(source, "table", None) is self.table, length)
        self.tokens = list(source.tokens[:length])

    def next_logits(self, position: int, token: int) -> np.ndarray:
        """Logits ``[vocab]`` for the token after ``token`` placed at ``position`` (a view of the table: read
        only)."""
        return self.table[position % self.table.shape[0], token]

    def forward(self, tokens: TokenIds, num_logits: int | None = None) -> np.ndarray:
        ids = self._check_forward(tokens)
        self.tokens.extend(ids.tolist())
        self.passes += 1
        n = len(self.tokens)
        k = ids.shape[0] if num_logits is None else num_logits
        positions = np.arange(n - k, n)
        # a fancy index copies: a fresh C-contiguous float32 array [k, vocab]
        return self.table[positions % self.table.shape[0], np.asarray(self.tokens[n - k :], dtype=np.int64)]

    def rollback(self, length: int) -> None:
        self._check_rollback(length)
        del self.tokens[length:]
