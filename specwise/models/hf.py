"""Adapter for any Hugging Face causal LM (the reference implementation of the Model contract).

Needs the ``hf`` extra (torch and transformers): imported only where a float32 model is loaded. At its boundary it
follows the contract of :mod:`specwise.models.base`: token ids in as anything ``numpy.asarray`` reads (converted
to a torch tensor on the model's device here), logits and features out as float32 numpy arrays on the CPU.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np

try:
    import torch
except ModuleNotFoundError as err:  # torch code: the hf extra
    from specwise.extras import missing_extra

    raise missing_extra(err, "hf", "specwise.models.hf (the Hugging Face models)") from err

from specwise.models.base import Model

__all__ = ["HFModel", "cache_keyword"]


def cache_keyword(module) -> str:
    """The keyword a transformers module's forward takes its KV cache by (``cache`` since 5.x, else
    ``past_key_values``, which 5.x deprecates)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class HFModel(Model):
    """Wraps a ``transformers`` causal LM and a ``DynamicCache`` holding one sequence."""

    def __init__(self, model, name: str = "hf") -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.name = name
        self.config = model.config
        self.device = str(next(model.parameters()).device)  # "cpu", "cuda:0": a plain string (the contract)
        out_emb = model.get_output_embeddings()
        self.vocab_size = int(out_emb.weight.shape[0]) if out_emb is not None else int(model.config.vocab_size)
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self._cache_cls = DynamicCache
        self._cache_kw = cache_keyword(model)
        self._base_cache_kw = cache_keyword(model.base_model)
        self._length = 0
        self._cache = self._new_cache()
        self._features = torch.empty(0)  # [capacity, hidden], written at positions < length when keep_features

    def _new_cache(self):
        try:
            return self._cache_cls(config=self.config)
        except TypeError:
            return self._cache_cls()

    def sequence(self) -> HFModel:
        """Another sequence over the same Hugging Face module (shared, not copied), with its own empty cache."""
        other = copy.copy(self)
        other._length = 0
        other._cache = other._new_cache()
        other._features = torch.empty(0)
        other.keep_features = False
        return other

    @property
    def length(self) -> int:
        return self._length

    def forward(self, tokens, num_logits: int | None = None) -> np.ndarray:
        ids = self._check_forward(tokens)  # an int64 array [k]
        k = ids.size
        keep = k if num_logits is None else num_logits
        with torch.inference_mode():
            return _numpy(self._forward(torch.tensor(ids, device=self.device), k, keep), self.vocab_size)

    def _forward(self, tokens: torch.Tensor, k: int, keep: int) -> torch.Tensor | None:
        """The last ``keep`` rows' logits (None for none) of ``k`` tokens on the model's device."""
        positions = torch.arange(self._length, self._length + k, device=self.device)[None]
        if self.keep_features:
            return self._forward_features(tokens, positions, keep)
        out = self.model(
            input_ids=tokens[None],
            position_ids=positions,
            use_cache=True,
            logits_to_keep=max(keep, 1),
            **{self._cache_kw: self._cache},
        )
        self._length += k
        return out.logits[0, -keep:] if keep else None

    def _forward_features(self, tokens: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor | None:
        """The base model's last hidden states (kept), then the output layer on the last ``keep`` rows."""
        hidden = self.model.base_model(
            input_ids=tokens[None],
            position_ids=positions,
            use_cache=True,
            **{self._base_cache_kw: self._cache},
        ).last_hidden_state[0]  # [k, hidden]
        start, end = self._length, self._length + tokens.numel()
        if end > self._features.shape[0]:  # grow by doubling, keeping what is cached
            grown = hidden.new_zeros((max(2 * self._features.shape[0], end), hidden.shape[-1]))
            kept = min(start, self._features.shape[0])  # fewer where keep_features was set after some positions
            if kept:
                grown[:kept] = self._features[:kept]
            self._features = grown
        self._features[start:end] = hidden
        self._length = end
        if keep == 0:
            return None
        return self.model.get_output_embeddings()(hidden[hidden.shape[0] - keep :])

    def features(self, start: int, end: int) -> np.ndarray:
        self._check_features(start, end)
        return np.array(self._features[start:end].float().cpu().numpy(), dtype=np.float32)  # a copy

    def rollback(self, length: int) -> None:
        self._check_rollback(length)
        if length == self._length:
            return
        if length == 0:
            self._cache = self._new_cache()
        else:
            if hasattr(self._cache, "is_croppable") and not self._cache.is_croppable:
                raise NotImplementedError(
                    f"{self.name}: this model's cache (sliding-window or recurrent layers) cannot be rolled back "
                    "exactly, so it cannot be used for speculative decoding"
                )
            self._cache.crop(length - self._length)  # a negative value removes that many tokens
        self._length = length


def _numpy(logits: torch.Tensor | None, vocab: int) -> np.ndarray:
    """Logits ``[n, vocab]`` as the contract returns them: float32, C-contiguous, on the CPU (``[0, vocab]`` for
    None)."""
    if logits is None:
        return np.empty((0, vocab), dtype=np.float32)
    return np.ascontiguousarray(logits.float().cpu().numpy())
