"""The Model contract: a causal LM with a KV cache that can be rolled back."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

__all__ = ["Model"]


class Model(ABC):
    """A causal language model holding one sequence in its cache.

    ``forward`` appends tokens to the cache and returns logits; ``rollback`` rewinds the cache to a length.
    Implementations must make ``rollback(n)`` followed by ``forward(tokens)`` give the same logits as if the
    rolled-back tokens had never been fed.
    """

    vocab_size: int
    device: torch.device
    max_length: int | None = None  # the longest sequence the model supports, when known
    keep_features: bool = False  # keep the last hidden states of cached positions (see ``features``)
    cost_curve: dict[int, float] | None = None  # time of a pass over k tokens / over 1 (a measured prior), if known

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens in the cache."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, num_logits: int | None = None) -> torch.Tensor:
        """Append ``tokens`` ``[k]`` (int64) at positions ``length .. length + k - 1``.

        Returns float32 logits ``[n, vocab]`` for the last ``n = num_logits`` positions (all ``k`` when None;
        0 returns an empty tensor and may skip the output layer). Logit row i predicts the token after
        input i.
        """

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Discard everything after the first ``length`` cached tokens."""

    supports_tree: bool = False  # forward_tree and keep_path are implemented

    def forward_tree(self, tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
        """Append a draft tree: ``tokens`` ``[k]`` in topological order, ``parents[i] < i`` the row of token i's
        parent (``parents[0] == -1``: row 0 continues the cached sequence). Row i sits at position
        ``length + depth(i)`` and sees the cache and its ancestors only. Returns logits ``[k, vocab]``; the cache
        then holds all k rows until :meth:`keep_path` keeps one branch."""
        raise NotImplementedError(f"{type(self).__name__} does not verify draft trees")

    def keep_path(self, start: int, rows: list[int]) -> None:
        """After :meth:`forward_tree` at ``start``: keep the rows ``rows`` (a path from row 0, increasing) as
        positions ``start ..``, and drop the rest (length becomes ``start + len(rows)``)."""
        raise NotImplementedError(f"{type(self).__name__} does not verify draft trees")

    @staticmethod
    def tree_layout(parents: list[int]) -> tuple[list[int], list[list[bool]]]:
        """Depth of each row and the ancestor matrix (``anc[i][j]``: row j is row i or one of its ancestors)."""
        k = len(parents)
        if k == 0 or parents[0] != -1 or any(not 0 <= parents[i] < i for i in range(1, k)):
            raise ValueError(f"a draft tree needs parents[0] == -1 and 0 <= parents[i] < i, got {parents}")
        depth = [0] * k
        anc = [[False] * k for _ in range(k)]
        for i in range(k):
            if i:
                depth[i] = depth[parents[i]] + 1
                anc[i] = list(anc[parents[i]])
            anc[i][i] = True
        return depth, anc

    def features(self, start: int, end: int) -> torch.Tensor:
        """The last hidden states (after the final norm: the output layer's input) at cached positions
        ``start .. end - 1``, as ``[end - start, hidden]``. Needs ``keep_features = True`` before those positions
        were fed; drafters that read the target's features (the trained head) set it."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its hidden states")

    def _check_features(self, start: int, end: int) -> None:
        if not self.keep_features:
            raise RuntimeError("features were not kept: set keep_features = True before feeding tokens")
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"features [{start}, {end}) outside the cache of {self.length} tokens")

    def reset(self) -> None:
        """Empty the cache."""
        self.rollback(0)

    def _check_forward(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 1 or tokens.numel() == 0:
            raise ValueError(f"forward takes a non-empty 1-D tensor of token ids, got shape {tuple(tokens.shape)}")
        if self.max_length is not None and self.length + tokens.numel() > self.max_length:
            raise ValueError(
                f"sequence of {self.length + tokens.numel()} tokens exceeds the model's context of "
                f"{self.max_length}: shorten the prompt or lower max_new_tokens"
            )

    def _check_rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the cache holds {self.length} tokens")
