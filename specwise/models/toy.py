"""A tiny table-driven model for tests and simulations.

The logits for the token after position i are ``table[i % periods, token_i]``: the distribution depends on the
context, so exact joint distributions of short continuations can be computed by enumeration.
"""

from __future__ import annotations

import torch

from specwise.models.base import Model

__all__ = ["ToyModel"]


class ToyModel(Model):
    """A Model whose next-token logits are looked up from a table ``[periods, vocab, vocab]``."""

    def __init__(self, table: torch.Tensor, max_length: int | None = None) -> None:
        if table.dim() != 3 or table.shape[1] != table.shape[2]:
            raise ValueError(f"table must be [periods, vocab, vocab], got {tuple(table.shape)}")
        self.table = table.float()
        self.vocab_size = table.shape[-1]
        self.device = table.device
        self.max_length = max_length
        self.tokens: list[int] = []
        self.passes = 0

    @classmethod
    def random(cls, vocab: int, periods: int = 3, scale: float = 2.0, seed: int = 0, **kw) -> ToyModel:
        gen = torch.Generator().manual_seed(seed)
        return cls(torch.randn(periods, vocab, vocab, generator=gen) * scale, **kw)

    def sequence(self) -> ToyModel:
        """Another sequence over the same table (shared, not copied), with no tokens."""
        return ToyModel(self.table, self.max_length)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def copy_prefix(self, source: Model, length: int) -> None:
        self._check_copy_prefix(source, getattr(source, "table", None) is self.table, length)
        self.tokens = list(source.tokens[:length])

    def next_logits(self, position: int, token: int) -> torch.Tensor:
        """Logits ``[vocab]`` for the token after ``token`` placed at ``position``."""
        return self.table[position % self.table.shape[0], token]

    def forward(self, tokens: torch.Tensor, num_logits: int | None = None) -> torch.Tensor:
        self._check_forward(tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.passes += 1
        k = tokens.numel() if num_logits is None else num_logits
        rows = [self.next_logits(p, self.tokens[p]) for p in range(len(self.tokens) - k, len(self.tokens))]
        return torch.stack(rows) if rows else self.table.new_empty((0, self.vocab_size))

    def rollback(self, length: int) -> None:
        self._check_rollback(length)
        del self.tokens[length:]
