"""The head file format: a directory with ``config.json`` (:class:`HeadConfig`, the target's identity) and
``model.safetensors`` (the trained weights and the draft vocabulary), and the checks that a head meets its target.

:func:`read_head` reads a directory as numpy arrays (:class:`HeadWeights`, what the drafter takes; no torch) and
:func:`write_head` writes one; the training module (:class:`~specwise.drafters.head.module.EagleHead`, torch: the
``distill`` extra) is read by ``load_head`` and written by ``module.save_head``. The target is read through the
protocol of its layers (:class:`~specwise.models.base.TargetLayers`: its embedding and output layer as rows, its
identity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specwise.drafters.head.checks import (
    FIXED_DTYPES,
    HeadFileError,
    HeadNotFoundError,
    check_config,
    read_config,
    read_tensors,
    write_safetensors,
)
from specwise.files import atomic_path, write_json_atomic
from specwise.models.base import WeightRows
from specwise.models.target_layers import TensorRows, target_layers

__all__ = [
    "HeadConfig",
    "HeadFileError",
    "HeadNotFoundError",
    "HeadWeights",
    "TargetMismatchError",
    "check_target",
    "check_target_shapes",
    "head_tensor_shapes",
    "read_head",
    "target_identity",
    "write_head",
]

FORMAT = "specwise-head"
FORMAT_VERSION = 1


class TargetMismatchError(HeadFileError):
    """The head was trained for another target model."""


@dataclass
class HeadConfig:
    """Shape of a head and the identity of the target it was trained for."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    draft_vocab_size: int
    target: dict = field(default_factory=dict)  # name, architecture, vocab_size, hidden_size, layers, fingerprint
    training: dict = field(default_factory=dict)  # how it was made (free-form, written by distill)

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict, path: Path | str = "config.json") -> HeadConfig:
        """The config in ``data`` (a parsed ``config.json``), every field checked (HeadFileError naming ``path``)."""
        return cls(**check_config(Path(path), data, tuple(cls.__dataclass_fields__), FORMAT, FORMAT_VERSION))


def head_tensor_shapes(config: HeadConfig) -> dict[str, tuple[int, ...]]:
    """The tensors of a head's file and their shapes, in the order :class:`EagleHead` keeps them (its
    ``state_dict``): the trained weights, then the draft vocabulary's ids and the rotary frequencies."""
    c = config
    d, hd = c.hidden_size, c.head_dim
    return {
        "feature_norm": (d,),
        "embed_norm": (d,),
        "attn_norm": (d,),
        "mlp_norm": (d,),
        "out_norm": (d,),
        "vocab_ids": (c.draft_vocab_size,),
        "inv_freq": (hd // 2,),
        "fc.weight": (d, 2 * d),
        "qkv.weight": ((c.num_heads + 2 * c.num_kv_heads) * hd, d),
        "o.weight": (d, c.num_heads * hd),
        "gate_up.weight": (2 * c.intermediate_size, d),
        "down.weight": (d, c.intermediate_size),
    }


def check_target_shapes(config: HeadConfig, vocab_ids: np.ndarray, embed: tuple, output: tuple) -> None:
    """Refuse a target whose embedding or output layer (shapes ``[vocab, hidden]``) does not fit the head: another
    hidden size, or fewer output rows than the draft vocabulary's ids need (TargetMismatchError)."""
    d = config.hidden_size
    for what, shape in (("embedding", tuple(embed)), ("output layer", tuple(output))):
        if len(shape) != 2 or shape[1] != d:
            raise TargetMismatchError(
                f"the head's hidden_size is {d}, but the target's {what} is {list(shape)}: use a head trained "
                "for this target (`specwise distill`)"
            )
    top = int(vocab_ids.max()) if vocab_ids.size else -1
    if top >= output[0]:
        raise TargetMismatchError(
            f"the head's draft vocabulary holds token {top}, outside the target's {output[0]} tokens: use a "
            "head trained for this target (`specwise distill`)"
        )


class HeadWeights:
    """A head as the drafter reads it (:func:`read_head`): its config and its tensors as numpy arrays (the
    weights in the file's dtype, float16 or float32; a BF16 file's as float32), and once attached
    (:meth:`attach_target`) the target's embedding and output layer, read row by row on demand.

    tensors: the names and shapes of :func:`head_tensor_shapes`; ``vocab_ids`` int64, ``inv_freq`` float32.
    """

    def __init__(self, config: HeadConfig, tensors: dict[str, np.ndarray]) -> None:
        shapes = head_tensor_shapes(config)
        if set(tensors) != set(shapes):
            raise ValueError(f"a head's tensors are {', '.join(shapes)}, got {', '.join(sorted(tensors))}")
        for name, shape in shapes.items():
            value = tensors[name]
            if not isinstance(value, np.ndarray) or value.shape != shape:
                got = value.shape if isinstance(value, np.ndarray) else type(value).__name__
                raise ValueError(f"the head's {name} must be a numpy array of shape {list(shape)}, got {got}")
        self.config = config
        self.tensors = dict(tensors)
        self.vocab_ids = np.ascontiguousarray(tensors["vocab_ids"], dtype=np.int64)
        self.inv_freq = np.ascontiguousarray(tensors["inv_freq"], dtype=np.float32)
        self.embed: WeightRows | None = None  # the target's embedding (rows read on demand), set by attach_target
        self.output: WeightRows | None = None  # the target's output layer
        self._output_rows: np.ndarray | None = None  # its draft-vocabulary rows, where given as they are

    @classmethod
    def from_module(cls, head) -> HeadWeights:
        """The numpy view of a training module (an :class:`EagleHead`: torch), with the target it is attached to."""
        tensors = {}
        for name, value in head.state_dict().items():
            value = value.detach().cpu()
            if str(value.dtype) == "torch.bfloat16":  # no numpy dtype: the same values in float32
                value = value.float()
            tensors[name] = value.numpy().copy()
        weights = cls(head.config, tensors)
        weights.embed, weights.output = _rows(head.embed), _rows(head._target_output)
        if head._head_weight is not None:  # the output rows, gathered already (or set without a target)
            gathered = TensorRows(head._head_weight)
            weights._output_rows = gathered.rows(np.arange(gathered.shape[0]))
        return weights

    def attach_target(self, target) -> None:
        """Take the target's embedding and output layer (``target``: its
        :class:`~specwise.models.base.TargetLayers`, or what :func:`~specwise.models.target_layers.target_layers`
        takes: a Hugging Face model), checked against the head's shapes."""
        layers = target_layers(target)
        embed, output = layers.embedding, layers.output
        check_target_shapes(self.config, self.vocab_ids, tuple(embed.shape), tuple(output.shape))
        self.embed, self.output, self._output_rows = embed, output, None

    def _require_target(self) -> None:
        if self.embed is None or (self.output is None and self._output_rows is None):
            raise RuntimeError("attach a target to the head first (attach_target)")

    def embedding_rows(self, ids) -> np.ndarray:
        """The target's embedding rows of ``ids``: float32 ``[n, hidden]``."""
        self._require_target()
        return self.embed.rows(np.ascontiguousarray(ids, dtype=np.int64).reshape(-1))

    def output_row_block(self, first: int, count: int) -> np.ndarray:
        """Rows ``first .. first + count - 1`` of the output layer over the draft vocabulary, float32."""
        self._require_target()
        if self._output_rows is not None:
            return np.ascontiguousarray(self._output_rows[first : first + count], dtype=np.float32)
        return self.output.rows(self.vocab_ids[first : first + count])

    def output_rows(self, dtype=np.float32, chunk: int = 1024) -> np.ndarray:
        """The output layer's draft-vocabulary rows ``[draft_vocab, hidden]`` in ``dtype``, gathered ``chunk`` rows
        at a time (no whole float32 copy on the way to float16)."""
        n = self.vocab_ids.size
        out = np.empty((n, self.config.hidden_size), dtype=dtype)
        for a in range(0, n, chunk):
            out[a : a + chunk] = self.output_row_block(a, min(chunk, n - a))
        return out


def read_head(directory: Path | str) -> HeadWeights:
    """Read and check a head directory (HeadFileError, a ValueError, names what is wrong): every field of the
    config, and every tensor's name, dtype, shape and values against it. Attach a target before drafting
    (:meth:`HeadWeights.attach_target`, after :func:`check_target`)."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    config = HeadConfig.from_json(read_config(cfg_path), cfg_path)
    expected = {name: (shape, FIXED_DTYPES.get(name)) for name, shape in head_tensor_shapes(config).items()}
    tensors = read_tensors(directory / "model.safetensors", expected, config.target["vocab_size"])
    return HeadWeights(config, tensors)


def target_identity(target, name: str) -> dict:
    """What a head records about its target (its :class:`~specwise.models.base.TargetLayers`, or a Hugging Face
    model), to refuse another target later (see :func:`check_target`).

    The fingerprint is the mean of 16 slices of the output layer's weight: it tells models apart and survives
    a change of dtype or file format of the same weights (a quantized target computes it without expanding its
    output layer).
    """
    layers = target_layers(target)
    return {
        "name": name,
        "architecture": layers.architecture,
        "vocab_size": int(layers.output.shape[0]),
        "hidden_size": int(layers.hidden_size),
        "num_layers": int(layers.num_layers),
        "fingerprint": layers.fingerprint(),
    }


def check_target(config: HeadConfig, target, name: str) -> None:
    """Raise TargetMismatchError when ``target`` (as :func:`target_identity` takes it) is not the target the head was
    trained for."""
    recorded = config.target
    actual = target_identity(target, name)
    for key in ("architecture", "vocab_size", "hidden_size", "num_layers"):
        if recorded.get(key) != actual[key]:
            raise TargetMismatchError(
                f"this head was trained for {recorded.get('name')!r} ({key} {recorded.get(key)}), but the target "
                f"{name!r} has {key} {actual[key]}: train a head for this target with `specwise distill`"
            )
    fp_a, fp_b = recorded.get("fingerprint", []), actual["fingerprint"]
    if len(fp_a) != len(fp_b) or any(abs(a - b) > 1e-3 * max(abs(a), 1e-6) + 1e-5 for a, b in zip(fp_a, fp_b)):
        raise TargetMismatchError(
            f"this head was trained for {recorded.get('name')!r}, and the target {name!r} has the same shape but "
            "different weights: train a head for this target with `specwise distill`"
        )


def write_head(directory: Path | str, config: HeadConfig, tensors: dict[str, np.ndarray], kinds=None) -> None:
    """Write a head directory atomically: ``model.safetensors`` (``tensors``, numpy arrays named and shaped as
    :func:`head_tensor_shapes` says; ``kinds``: a tensor's file dtype where numpy has none, ``"BF16"``), then
    ``config.json``."""
    directory = Path(directory)
    shapes = head_tensor_shapes(config)
    if set(tensors) != set(shapes) or any(tuple(np.shape(tensors[k])) != v for k, v in shapes.items()):
        got = {k: list(np.shape(v)) for k, v in tensors.items()}
        raise ValueError(f"a head's tensors are {shapes}, got {got}")
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / "model.safetensors") as tmp:
        write_safetensors(tmp, tensors, kinds)
    write_json_atomic(directory / "config.json", config.to_json())


def _rows(weight) -> WeightRows | None:
    """A training module's view of a target weight as rows: as it is where it is rows already (a quantized
    target's), a torch tensor's read back to the host."""
    if weight is None or isinstance(weight, WeightRows):
        return weight
    return TensorRows(weight)
