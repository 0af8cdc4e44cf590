"""The `head` drafter: a small trained decoder layer on the target's own features (in the spirit of EAGLE).

- :mod:`~specwise.drafters.head.format`: the head directory (config, weights), the target's identity and checks;
  :func:`read_head` reads one as numpy arrays (:class:`HeadWeights`);
- :mod:`~specwise.drafters.head.checks`: the checks of a head's files (untrusted input) before use;
- :mod:`~specwise.drafters.head.drafter`: :class:`HeadDrafter`, which drafts with a trained head (numpy and the
  native kernels: no torch);
- :mod:`~specwise.drafters.head.quantized`: the head's step on the quantized kernels;
- :mod:`~specwise.drafters.head.module`: the training module :class:`EagleHead` and :func:`new_head` (torch: the
  ``distill`` extra; imported when first asked for).
"""

from specwise.drafters.head.drafter import HeadDrafter
from specwise.drafters.head.format import (
    HeadConfig,
    HeadFileError,
    HeadNotFoundError,
    HeadWeights,
    TargetMismatchError,
    check_target,
    load_head,
    read_head,
    save_head,
    target_identity,
)

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


def __getattr__(name: str):
    """The training module's names (torch), imported when first asked for."""
    if name in ("EagleHead", "new_head"):
        from specwise.drafters.head import module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
