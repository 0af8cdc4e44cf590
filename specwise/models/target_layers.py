"""A target's layers as a drafter trained on its features reads them (:class:`~specwise.models.base.TargetLayers`):
:func:`target_layers` takes what a LoadedModel holds in ``hf_model`` (a quantized target's ``TargetWeights``, which
is one already, or a Hugging Face module) and gives the protocol. The Hugging Face side reads the module's torch
tensors through their own methods: nothing here imports torch."""

from __future__ import annotations

import numpy as np

from specwise.models.base import TargetLayers

__all__ = ["HFTargetLayers", "TensorRows", "target_layers"]


class TensorRows:
    """A torch weight ``[rows, columns]`` (on any device) as :class:`~specwise.models.base.WeightRows`: rows read
    back to the host as float32. ``tensor``: the weight itself, for torch code that indexes it on its device."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def rows(self, ids) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        rows = self.tensor[ids.tolist()].detach().float().cpu().numpy()
        return np.ascontiguousarray(rows, dtype=np.float32)

    def row(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        value = self.rows(np.array([index]))[0]
        if out is None:
            return value
        out[...] = value
        return out


class HFTargetLayers:
    """A Hugging Face causal LM's layers as :class:`~specwise.models.base.TargetLayers` (the ``hf`` extra):
    its input and output embeddings' weights, its class name, its config's hidden size and number of layers."""

    def __init__(self, module) -> None:
        self.module = module
        self.architecture = type(module).__name__
        self.hidden_size = int(module.config.hidden_size)
        self.num_layers = int(module.config.num_hidden_layers)
        self.embedding = TensorRows(module.get_input_embeddings().weight)
        self.output = TensorRows(module.get_output_embeddings().weight)

    def layer_shape(self) -> dict:
        """The shape of one of the module's decoder layers, from its config (a field it leaves out: the Llama
        default; ``intermediate_size`` None where it has none): what a head shaped like one of its layers takes."""
        config = self.module.config
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        intermediate = getattr(config, "intermediate_size", None)
        return {
            "hidden_size": hidden,
            "num_heads": heads,
            "num_kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(config, "head_dim", None) or hidden // heads),
            "intermediate_size": None if intermediate is None else int(intermediate),
            "rms_eps": float(getattr(config, "rms_norm_eps", 1e-6)),
            "rope_theta": float(getattr(config, "rope_theta", 10000.0)),
        }

    def inverse_frequencies(self):
        """The rotary embedding's inverse frequencies (a torch tensor), where the module keeps them (None: not)."""
        rotary = getattr(getattr(self.module, "model", None), "rotary_emb", None)
        return None if rotary is None else rotary.inv_freq

    def final_norm(self):
        """The weight of the final norm before the output layer (a torch tensor), where the module has one."""
        norm = getattr(getattr(self.module, "model", None), "norm", None)
        return None if norm is None else norm.weight

    def fingerprint(self, chunks: int = 16) -> list[float]:
        """``torch.chunk``'s ``chunks`` slices of the flattened output layer, each's mean absolute value."""
        parts = self.output.tensor.detach().float().flatten().chunk(chunks)
        return [round(float(c.double().abs().mean()), 6) for c in parts]


def target_layers(weights) -> TargetLayers:
    """The layers of a target's weights (``LoadedModel.hf_model``): a :class:`~specwise.models.base.TargetLayers`
    as it is (a quantized target's ``TargetWeights``), else a Hugging Face module's (:class:`HFTargetLayers`)."""
    if isinstance(weights, TargetLayers):
        return weights
    return HFTargetLayers(weights)
