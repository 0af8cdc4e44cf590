"""The `head` drafter: a small trained decoder layer on the target's own features (in the spirit of EAGLE).

- :mod:`~specwise.drafters.head.format`: the head directory (config, weights), the target's identity and checks;
  :func:`read_head` reads one as numpy arrays (:class:`HeadWeights`);
- :mod:`~specwise.drafters.head.checks`: the checks of a head's files (untrusted input) before use;
- :mod:`~specwise.drafters.head.drafter`: :class:`HeadDrafter`, which drafts with a trained head (numpy and the
  native kernels: no torch);
- :mod:`~specwise.drafters.head.quantized`: the head's step on the quantized kernels;
- :mod:`~specwise.drafters.head.module`: the training module :class:`EagleHead`, :func:`new_head` and
  :func:`save_head` (torch: the ``distill`` extra; imported when first asked for).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specwise.drafters.head.drafter import HeadDrafter
from specwise.drafters.head.format import (
    HeadConfig,
    HeadFileError,
    HeadNotFoundError,
    HeadWeights,
    TargetMismatchError,
    check_target,
    read_head,
    target_identity,
)

if TYPE_CHECKING:
    from specwise.drafters.head.module import EagleHead

__all__ = [
    "HeadConfig",
    "EagleHead",
    "HeadDrafter",
    "HeadFileError",
    "HeadNotFoundError",
    "HeadWeights",
    "TargetMismatchError",
    "check_target",
    "load_head",
    "new_head",
    "read_head",
    "save_head",
    "target_identity",
]


def load_head(directory: Path | str, device="cpu", dtype="float32") -> EagleHead:
    """Read a head directory as the training module (:class:`EagleHead`, torch: the ``distill`` extra) on
    ``device``; attach a target before use. The files are checked as :func:`read_head` checks them.

    dtype: the floating-point weights' dtype (a torch dtype or its name; float32 for training); None keeps the
    file's (a BF16 file's weights come as float32). The drafter takes :func:`read_head`'s numpy head instead.
    """
    weights = read_head(directory)  # the files' refusals first, with or without torch
    try:
        import torch
    except ModuleNotFoundError as err:
        from specwise.extras import missing_extra

        raise missing_extra(err, "distill", "the head's training module (load_head)") from err

    from specwise.drafters.head.module import EagleHead, torch_dtype

    with torch.device("meta"):  # shapes only: the file's tensors become the parameters (no initialisation)
        head = EagleHead(weights.config)
    dtype = None if dtype is None else torch_dtype(dtype)

    def cast(name: str, value: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(value)
        if not tensor.is_floating_point() or name == "inv_freq" or dtype is None:
            return tensor
        return tensor.to(dtype)

    head.load_state_dict({name: cast(name, value) for name, value in weights.tensors.items()}, assign=True)
    return head.to(device).eval()


def __getattr__(name: str):
    """The training module's names (torch), imported when first asked for."""
    if name in ("EagleHead", "new_head", "save_head"):
        from specwise.drafters.head import module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
