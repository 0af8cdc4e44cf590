"""The head file format: a directory with ``config.json`` (:class:`HeadConfig`, the target's identity) and
``model.safetensors`` (the trained weights and the draft vocabulary), and the checks that a head meets its target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specwise.drafters.head.checks import (
    FIXED_DTYPES,
    HeadFileError,
    HeadNotFoundError,
    check_config,
    read_config,
    read_tensors,
)
from specwise.files import atomic_path, write_json_atomic

if TYPE_CHECKING:
    from specwise.drafters.head.module import EagleHead

__all__ = [
    "HeadConfig",
    "HeadFileError",
    "HeadNotFoundError",
    "TargetMismatchError",
    "check_target",
    "load_head",
    "save_head",
    "target_identity",
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


def target_identity(hf_model, name: str) -> dict:
    """What a head records about its target, to refuse another target later (see :func:`check_target`).

    The fingerprint is the mean of 16 slices of the output layer's weight: it tells models apart and survives
    a change of dtype or file format of the same weights.
    """
    config = hf_model.config
    weight = hf_model.get_output_embeddings().weight
    if hasattr(hf_model, "fingerprint"):  # a quantized target computes it without expanding its output layer
        fingerprint = hf_model.fingerprint()
    else:
        chunks = weight.detach().float().flatten().chunk(16)
        fingerprint = [round(float(c.double().abs().mean()), 6) for c in chunks]
    return {
        "name": name,
        "architecture": getattr(hf_model, "architecture", type(hf_model).__name__),
        "vocab_size": int(weight.shape[0]),
        "hidden_size": int(config.hidden_size),
        "num_layers": int(config.num_hidden_layers),
        "fingerprint": fingerprint,
    }


def check_target(config: HeadConfig, hf_model, name: str) -> None:
    """Raise TargetMismatchError when ``hf_model`` is not the target the head was trained for."""
    recorded = config.target
    actual = target_identity(hf_model, name)
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


def save_head(head: EagleHead, directory: Path, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` (trainable weights, the draft vocabulary) atomically."""
    from safetensors.torch import save_file

    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value.to(dtype) if value.is_floating_point() and name != "inv_freq" else value
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    write_json_atomic(directory / "config.json", head.config.to_json())


def load_head(
    directory: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype | None = torch.float32
) -> EagleHead:
    """Read a head directory onto ``device``; attach a target before use.

    The files are checked before use (HeadFileError, a ValueError, names what is wrong): every field of the config,
    and every tensor's name, dtype, shape and values against it. :func:`check_target` then checks the head against
    its target.

    dtype: the floating-point weights' dtype (float32 for training); None keeps the file's (a drafter makes the
    copies it computes with, so a float16 file needs no float32 copy on the way).
    """
    from specwise.drafters.head.module import EagleHead

    directory = Path(directory)
    cfg_path = directory / "config.json"
    config = HeadConfig.from_json(read_config(cfg_path), cfg_path)
    with torch.device("meta"):  # shapes only: the file's tensors become the parameters (no initialisation)
        head = EagleHead(config)
    expected = {name: (value.shape, FIXED_DTYPES.get(name)) for name, value in head.state_dict().items()}
    state = read_tensors(directory / "model.safetensors", expected, config.target["vocab_size"])

    def cast(name: str, value: torch.Tensor) -> torch.Tensor:
        if not value.is_floating_point() or name == "inv_freq" or dtype is None:
            return value
        return value.to(dtype)

    head.load_state_dict({name: cast(name, value) for name, value in state.items()}, assign=True)
    return head.to(device).eval()
